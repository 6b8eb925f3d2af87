"""Plan: how one design maps onto the array. Produced by kernels/, checked there against hw/
limits, consumed by the sim cost model and recorded in the trace."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch_xdna.runtime.errors import XdnaError


class PlanError(XdnaError, ValueError):
    """A design cannot be mapped onto the array: names the limit and the numbers."""

    def __init__(self, design: str, limit: str, needed: float, available: float, hint: str = ""):
        self.design, self.limit, self.needed, self.available = design, limit, needed, available
        msg = f"xdna plan for {design}: {limit} exceeded: needs {needed}, hardware has {available}"
        super().__init__(msg + (f". {hint}" if hint else ""))


@dataclass(frozen=True)
class Plan:
    """The mapping of one design onto the array (per launch)."""

    design: str                     # design kind, e.g. "gemm"
    dtype: str                      # operand numerics: "bf16" | "int8" | "bfp16" | "int4" | "fp32-vec"
    columns: int
    cores: int
    tile: tuple[int, ...] = ()      # per-core tile shape (e.g. m, k, n)
    l1_bytes: int = 0               # per core, incl. double buffers
    memtile_bytes: int = 0          # per mem tile
    core_bds: int = 0
    memtile_bds: int = 0
    core_locks: int = 0
    shim_tasks: int = 0             # per shim channel in flight
    double_buffered: bool = True
    dram_read_bytes: int = 0        # bytes streamed DRAM -> array, with the tiling's reuse
    dram_write_bytes: int = 0
    macs: int = 0                   # useful multiply-accumulates
    padded_macs: int = 0            # MACs executed incl. padding to the mmul tile
    vector_elems: int = 0           # elementwise/reduction element-ops (on the vector unit)
    compute_cycles: float = 0.0     # critical-path core cycles
    dma_shapes: tuple = ()
    notes: dict = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.design}[{self.dtype}] cols={self.columns} cores={self.cores} "
                f"tile={self.tile} L1={self.l1_bytes}B mem={self.memtile_bytes}B")
