"""Selecting and running the transaction level of the `sim` backend.

TORCH_XDNA_SIM_LEVEL=functional (default) | txn picks the level per process; `use("txn")`
(a context manager) or `SimDevice(level="txn")` per test. At the txn level a launch of a design
that lowers to one ArrayProgram is: lower (cached per design), encode its runtime sequence bound
to the launch's buffer sizes and scalars (cached per binding: a new shape is a new stream, never
a rebuild), and execute the stream (runtime/sim/txn.py). Designs without a single-program
lowering run at the functional level and are counted (`fallbacks`).

The lowering itself lives in kernels/ (upper layer); it registers here with `set_lowerer`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

import torch

from torch_xdna.array import ir
from torch_xdna.array import txn as T
from torch_xdna.runtime import settings
from torch_xdna.runtime.errors import XdnaError
from torch_xdna.runtime.sim import core_kernels
from torch_xdna.runtime.sim import txn as sim_txn

LEVELS = settings.choices("TORCH_XDNA_SIM_LEVEL")
_lowerer: Callable | None = None


_host_layouts: dict[str, Callable] = {}


def register_host_layout(kind: str, fn: Callable) -> None:
    """fn(design, gen, inputs) -> the inputs as the program's host arguments expect them (e.g.
    weights packed into per-tile runs, kernels/ops/gemm_pack.pack_weight_tiles), or None."""
    _host_layouts[kind] = fn


def set_lowerer(fn: Callable) -> None:
    """fn(design, gen, **scalars) -> tuple[ArrayProgram, ...] (kernels/lower.lower)."""
    global _lowerer
    _lowerer = fn


def level(default: str | None = None) -> str:
    return settings.get("TORCH_XDNA_SIM_LEVEL", default)


def use(name: str):
    """Run the enclosed launches at simulation level `name` (this thread)."""
    return settings.override("TORCH_XDNA_SIM_LEVEL", name)


TORCH_OF = {"bf16": torch.bfloat16, "f32": torch.float32, "i8": torch.int8, "i16": torch.int16,
            "i32": torch.int32, "u8": torch.uint8, "u32": torch.int32, "f16": torch.float16,
            "i64": torch.int64}


class Unlowered(XdnaError):
    """The design has no single-program array lowering: the launch runs functionally."""


class TxnRunner:
    """Per device: lowered programs and encoded streams, cached; executes launches."""

    def __init__(self, gen, max_streams: int = 256):
        self.gen = gen
        self.programs: dict[tuple, tuple[ir.ArrayProgram, ...] | Exception] = {}
        self.streams: OrderedDict[tuple, tuple[list[int], T.StreamStats]] = OrderedDict()
        self.max_streams = max_streams
        self.fallbacks = 0
        self.fallback_reasons: dict[str, str] = {}    # design name -> why it ran functionally
        self.launches = 0
        self.last: dict = {}

    def program(self, design, scalars: dict, inputs=()) -> ir.ArrayProgram:
        """The design's program for this launch. Lowerings that read input values (gather BDs
        from the indices) are not cached: each index set is a new stream of the same design."""
        if _lowerer is None:
            raise Unlowered("no array lowering registered (import torch_xdna.kernels.aie.refs)")
        if scalars.get("spans"):            # the array programs' attention is causal only
            raise Unlowered(f"{design.name}: bidirectional spans (image blocks) have no array "
                            f"lowering yet")
        key = (design.key, tuple(sorted(scalars.items())))
        hit = self.programs.get(key)
        if hit is None:
            try:
                hit = tuple(_lowerer(design, self.gen, inputs=list(inputs), **scalars))
            except Exception as e:          # LoweringError and friends: the design stays functional
                hit = e
            per_launch = not isinstance(hit, Exception) and any(
                dict(p.notes).get("indices_read_at_stream_generation") for p in hit)
            if len(self.programs) > 1024:
                self.programs.clear()
            if not per_launch:
                self.programs[key] = hit
        if isinstance(hit, Exception):
            raise Unlowered(str(hit))
        return hit

    def host_inputs(self, design, progs, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The launch's inputs as its programs' host arguments take them: packed by the
        registered host-layout packer when the programs name one (the xrt backend's staged
        launches use the same packing), else unchanged."""
        if not any(dict(p.notes).get("host_layout") for p in progs):
            return list(inputs)
        packer = _host_layouts.get(design.kind)
        packed = packer(design, self.gen, list(inputs)) if packer else None
        if packed is None:
            raise Unlowered(f"{design.name}: its host layout ({dict(progs[0].notes)['host_layout']}) "
                            f"has no packer registered")
        return list(packed)

    def _stages(self, design, progs) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(launch arg names in launch order, scratch arg names) of a staged launch."""
        if len(progs) == 1:
            return tuple(a.name for a in progs[0].sequence.args), ()
        notes = [dict(p.notes) for p in progs]
        if any(n.get("executable") is False for n in notes):
            why = next((n["not_executable"] for n in notes if n.get("not_executable")), "")
            raise Unlowered(f"{design.name}: its stage programs are structural only (not executable "
                            f"at the transaction level){': ' + why if why else ''}")
        launch = notes[0].get("launch_args")
        if not launch:
            raise Unlowered(f"{design.name}: {len(progs)} stages but no launch_args note to bind them")
        scratch = tuple(dict.fromkeys(x for n in notes for x in n.get("scratch_args", ())))
        return tuple(launch), scratch

    def stream(self, program: ir.ArrayProgram, binding: T.LaunchBinding) -> tuple[list[int], T.StreamStats]:
        key = (id(program), binding)       # id: a cached program object lives as long as its entry
        hit = self.streams.get(key)
        if hit is None:
            words = T.encode_sequence(program, binding)
            hit = (words, T.stream_stats(words))
            self.streams[key] = hit
            if len(self.streams) > self.max_streams:
                self.streams.popitem(last=False)
        else:
            self.streams.move_to_end(key)
        return hit

    def run(self, design, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
            scalars: dict) -> T.StreamStats:
        """Execute one launch at the transaction level (each stage's stream in order, through
        scratch host buffers); raises Unlowered to fall back. Returns the launch's stream counts."""
        progs = self.program(design, scalars, inputs)
        inputs = self.host_inputs(design, progs, inputs)
        launch, scratch = self._stages(design, progs)
        for p in progs:                  # every core kernel needs a reference at this level
            for k in p.kernels:
                try:
                    core_kernels.lookup(k.symbol)
                except core_kernels.UnknownCoreKernel as e:
                    raise Unlowered(str(e)) from None
        tensors = list(inputs) + list(outputs)
        if len(launch) != len(tensors):
            raise Unlowered(f"{design.name}: runtime sequence takes {len(launch)} buffers, the launch "
                            f"binds {len(tensors)}")
        types = {a.name: a.type for p in progs for a in p.sequence.args}
        host: dict[str, torch.Tensor] = {}
        for name, t in zip(launch, tensors):
            ty = types.get(name)
            dt = TORCH_OF.get(ty.dtype) if ty else None
            if ty is not None and t.numel() != ty.numel:
                t = _compact(t)          # a broadcast (stride-0) view: the buffer holds its base
            if dt is None or t.numel() != ty.numel:
                raise Unlowered(f"{design.name}: argument {name} ({ty}) does not match the launch "
                                f"tensor {tuple(t.shape)} {t.dtype}")
            flat = torch.empty(t.numel(), dtype=dt)
            flat.copy_(t.detach().reshape(-1))
            host[name] = flat.view(torch.uint8)
        for name in scratch:
            host[name] = torch.zeros(int(types[name].nbytes), dtype=torch.uint8)
        total = None
        counts_all: dict = {}
        for prog in progs:
            bufs = [host[a.name] for a in prog.sequence.args]
            binding = T.LaunchBinding.of([h.numel() for h in bufs], **scalars)
            words, stats = self.stream(prog, binding)
            counts = sim_txn.execute(prog, words, bufs, scalars,
                                     queue_depth=self.gen.shim_task_queue_depth.value,
                                     timeout_ms=self.gen.job_timeout_ms.value)
            for k, v in counts.items():
                counts_all[k] = counts_all.get(k, 0) + v
            total = stats if total is None else _add_stats(total, stats)
        n_in = len(inputs)
        for name, t in zip(launch[n_in:], outputs):
            t.copy_(host[name].view(TORCH_OF[types[name].dtype]).reshape(t.shape).to(t.dtype))
        self.launches += 1
        self.last = dict(counts_all, words=total.words, stages=len(progs))
        return total


def _compact(t: torch.Tensor) -> torch.Tensor:
    """A broadcast view without its stride-0 dimensions (what its host buffer holds)."""
    for d in range(t.dim() - 1, -1, -1):
        if t.stride(d) == 0 and t.shape[d] > 1:
            t = t.narrow(d, 0, 1)
    return t.contiguous()


def _add_stats(a: T.StreamStats, b: T.StreamStats) -> T.StreamStats:
    """Counts of a staged launch: the stages' streams together."""
    cols = dict(a.bds_by_column)
    for c, n in b.bds_by_column:
        cols[c] = cols.get(c, 0) + n
    return T.StreamStats(a.words + b.words, a.ops + b.ops, a.bd_writes + b.bd_writes, a.patches + b.patches,
                         a.pushes + b.pushes, a.syncs + b.syncs, a.other_writes + b.other_writes,
                         a.mm2s_bytes + b.mm2s_bytes, a.s2mm_bytes + b.s2mm_bytes,
                         tuple(sorted(cols.items())), a.sync_groups + b.sync_groups)
