"""Capacity checks shared by every design's planner: one place that knows the array's limits.

Each check reads its limit from the Generation (hw/) and raises PlanError naming the limit and
both numbers, so an impossible mapping fails at plan time instead of hanging on hardware (a
dropped shim task or an over-subscribed lock is silent on the real NPU).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from torch_xdna.hw import Generation
from torch_xdna.runtime.plan import Plan, PlanError

ACC_BYTES = 4                      # fp32 / int32 accumulator element


@dataclass(frozen=True)
class DmaTransfer:
    """One DMA descriptor: up to max_dma_dims (size, stride) pairs, innermost last, in elements."""

    name: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def elements(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n


def need(design: str, limit: str, needed: float, available: float, hint: str = "") -> None:
    """Raise PlanError when `needed` exceeds `available`."""
    if needed > available:
        raise PlanError(design, limit, needed, available, hint)


def require_dtype(gen: Generation, design: str, dtype: str) -> tuple[int, int, int]:
    """The native mmul tile (m, k, n) of `dtype` on this generation, or PlanError."""
    shapes = gen.mmul_shape.value
    if dtype not in shapes:
        raise PlanError(design, f"{dtype} matmul support on {gen.name}", 1, 0,
                        f"{gen.name} supports: {', '.join(shapes)}; pick one of those dtypes")
    return shapes[dtype]


def check_mmul_tile(gen: Generation, design: str, dtype: str, tile: Sequence[int]) -> None:
    """A per-core matmul tile must be a whole number of native mmul tiles."""
    native = require_dtype(gen, design, dtype)
    for dim, (t, n) in zip("mkn", zip(tile, native)):
        if t % n:
            raise PlanError(design, f"{dtype} native mmul tile ({'x'.join(map(str, native))}) "
                            f"multiple in {dim}", t, n, f"tile {dim} must be a multiple of {n}")


def check_dma(gen: Generation, design: str, transfers: Iterable[DmaTransfer]) -> None:
    """Every descriptor: at most max_dma_dims dimensions, each stride below max_dma_stride."""
    for t in transfers:
        need(design, f"DMA dimensions ({t.name})", len(t.sizes), gen.max_dma_dims.value,
             "fold the transfer into fewer dimensions")
        for s in t.strides:
            need(design, f"DMA stride limit ({t.name})", s, gen.max_dma_stride.value,
                 "split the dimension into pieces whose row stride fits, or transpose the operand")


def check_plan(gen: Generation, design: str, plan: Plan) -> Plan:
    """Validate a finished plan against every capacity of the array; returns it unchanged."""
    n = plan.notes
    need(design, "array columns", plan.columns, gen.columns.value)
    need(design, "compute cores", plan.cores, gen.cores)
    need(design, "L1 data memory per core (64 KiB minus stack reserve)", plan.l1_bytes,
         gen.l1_usable, "use smaller per-core tiles or split the op")
    need(design, "mem tile memory (per column)", plan.memtile_bytes, gen.memtile_bytes.value,
         "use smaller mem-tile panels")
    need(design, "core buffer descriptors", plan.core_bds, gen.core_bds.value)
    need(design, "mem tile buffer descriptors", plan.memtile_bds, gen.memtile_bds.value)
    need(design, "core locks", plan.core_locks, gen.core_locks.value)
    need(design, "mem tile locks", n.get("memtile_locks", 0), gen.memtile_locks.value)
    for key, limit, (cin, cout) in (
            ("core_dma", "core DMA channels", gen.core_dma_channels.value),
            ("memtile_dma", "mem tile DMA channels", gen.memtile_dma_channels.value),
            ("shim_dma", "shim DMA channels (per column)", gen.shim_dma_channels.value)):
        used_in, used_out = n.get(key, (0, 0))
        need(design, f"{limit} in", used_in, cin)
        need(design, f"{limit} out", used_out, cout)
    need(design, "shim DMA task queue depth (tasks in flight per channel)", plan.shim_tasks,
         gen.shim_task_queue_depth.value, "further tasks would be dropped silently on hardware")
    check_dma(gen, design, (t for t in plan.dma_shapes if isinstance(t, DmaTransfer)))
    return plan


def lanes(gen: Generation, elem_bits: int = 32) -> int:
    """Vector lanes per core per cycle for an element width."""
    return gen.vector_bits.value // elem_bits * gen.vector_flops_per_lane.value
