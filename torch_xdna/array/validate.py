"""Check an ArrayProgram is consistent and fits the project's budget; return what it uses.

Counting is array/usage.py's (mlir-aie's object-FIFO allocation); the capacity checks (memory,
BDs, locks, channels, shim BDs in flight) are array/rules.py's upstream rules, run here against
the plan's L1 budget (64 KiB minus the engine's stack reserve, Generation.l1_usable), stricter
than upstream's 1 KiB default stack. Checked here only: access patterns (dims, strides), every
task's fifo/arg/column/direction, offsets inside the host buffer, the shim task-queue depth, and
that each fifo carries as many elements per launch as its consumers acquire. Errors name the
program, the tile or op, the limit and both numbers.
"""
from __future__ import annotations

from collections import Counter

from torch_xdna.array import ir, rules
from torch_xdna.array.usage import Usage, count_acquires, fifo_elements, usage, walk
from torch_xdna.hw import Generation, get_generation

__all__ = ["ArrayIRError", "Usage", "fifo_elements", "usage", "validate"]


class ArrayIRError(ValueError):
    """An ArrayProgram breaks a hardware limit or is inconsistent."""


def _fail(prog, where, limit, needed, available, hint=""):
    msg = (f"array program {prog.name}: {where}: {limit} exceeded: needs {needed}, "
           f"hardware has {available}")
    raise ArrayIRError(msg + (f". {hint}" if hint else ""))


def validate(prog: ir.ArrayProgram, gen: Generation | None = None) -> Usage:
    """Raise ArrayIRError on the first broken limit or inconsistency; return the usage."""
    gen = gen or get_generation(prog.generation)
    _check_refs(prog, gen)
    u = usage(prog)
    for v in rules.check(prog, gen, rules.CAPACITY, l1_limit=gen.l1_usable, u=u):
        raise ArrayIRError(f"array program {prog.name}: {v.where}: {v.message} ({v.rule}, "
                           f"{v.citation})")
    for key, n in u.shim_queue.items():
        if n > gen.shim_task_queue_depth.value:
            _fail(prog, f"shim column {key[0]} {key[1]} channel {key[2]}",
                  "task queue depth (tasks in flight)", n, gen.shim_task_queue_depth.value,
                  "further tasks would be dropped silently on hardware")
    _check_balance(prog)
    return u


def _check_dims(prog, where, dims, max_dims, gen):
    if len(dims) > max_dims:
        _fail(prog, where, "DMA dimensions", len(dims), max_dims)
    for size, stride in dims:
        if stride > gen.max_dma_stride.value:
            _fail(prog, where, "DMA stride", stride, gen.max_dma_stride.value)
        if size < 0 or stride < 0:
            raise ArrayIRError(f"array program {prog.name}: {where}: negative size or stride "
                               f"in {dims}")


def _check_refs(prog: ir.ArrayProgram, gen: Generation) -> None:
    names = Counter(f.name for f in prog.fifos)
    dup = [n for n, k in names.items() if k > 1]
    if dup:
        raise ArrayIRError(f"array program {prog.name}: fifo names used twice: {dup}")
    tiles = set(prog.tiles)
    for f in prog.fifos:
        for t in f.endpoints:
            if t not in tiles:
                raise ArrayIRError(f"array program {prog.name}: fifo {f.name} uses unplaced tile {t.name}")
        if f.depth < 1:
            raise ArrayIRError(f"array program {prog.name}: fifo {f.name} depth {f.depth} < 1")
        md = gen.dma_bd_dims.value[f.producer.kind]
        _check_dims(prog, f"fifo {f.name} dims_to_stream", f.dims_to_stream, md, gen)
        if f.dims_to_stream:
            reach = sum((s - 1) * st for s, st in f.dims_to_stream) + 1
            if prog.link_of(f.name) is None and reach > f.elem.numel:
                raise ArrayIRError(f"array program {prog.name}: fifo {f.name}: access pattern "
                                   f"reaches element {reach}, buffer has {f.elem.numel}")
        if f.pad_dims:
            total = 1
            for (size, _), (lo, hi) in zip(f.dims_to_stream, f.pad_dims):
                total *= lo + size + hi
            if f.producer.kind != "mem" or len(f.pad_dims) != len(f.dims_to_stream) \
                    or total != f.elem.numel:
                raise ArrayIRError(f"array program {prog.name}: fifo {f.name}: pad_dims "
                                   f"{f.pad_dims} need a mem-tile producer and one (before, after) "
                                   f"per dims_to_stream dim padding the walk to the element "
                                   f"({total} != {f.elem.numel})")
    for ln in prog.links:
        for n in ln.srcs + ln.dsts:
            prog.fifo(n)
        if ln.kind == "split" and ln.dst_offsets and len(ln.dst_offsets) != len(ln.dsts):
            raise ArrayIRError(f"array program {prog.name}: split link offsets do not match {ln.dsts}")
        if ln.emits < 1 or ln.emits > 1 and ln.kind == "join":
            raise ArrayIRError(f"array program {prog.name}: link {ln.srcs}->{ln.dsts} emits "
                               f"{ln.emits}: a split or forward re-streams >= 1 elements per source "
                               f"element, a join exactly 1")
        if ln.emits > 1:
            src = prog.fifo(ln.srcs[0])
            for n in ln.dsts:
                d = prog.fifo(n)
                walked = 1
                for size, _ in d.dims_to_stream:
                    walked *= size
                need = ln.emits * d.elem.numel
                if not d.dims_to_stream or walked != need:
                    raise ArrayIRError(f"array program {prog.name}: fifo {n}: a link emitting "
                                       f"{ln.emits} elements needs dims_to_stream walking {need} "
                                       f"values of {src.name}'s element, got {walked}")
    kernels = {k.symbol: k for k in prog.kernels}
    bufs = {b.name for b in prog.buffers}
    fifo_names = set(names)
    for core in prog.cores:
        for op in walk(core.body):
            if isinstance(op, (ir.Acquire, ir.Release)):
                if op.fifo not in fifo_names:
                    raise ArrayIRError(f"array program {prog.name}: core {core.tile.name} "
                                       f"uses unknown fifo {op.fifo}")
            elif isinstance(op, ir.Call):
                k = kernels.get(op.kernel)
                if k is None:
                    raise ArrayIRError(f"array program {prog.name}: core {core.tile.name} calls "
                                       f"undeclared kernel {op.kernel}")
                if len(op.args) != len(k.arg_types):
                    raise ArrayIRError(f"array program {prog.name}: call {op.kernel} on "
                                       f"{core.tile.name} has {len(op.args)} args, kernel takes "
                                       f"{len(k.arg_types)}")
                for a, at in zip(op.args, k.arg_types):
                    if isinstance(a, ir.FifoElem):
                        if prog.fifo(a.fifo).elem != at:
                            raise ArrayIRError(
                                f"array program {prog.name}: call {op.kernel} on {core.tile.name}: "
                                f"fifo {a.fifo} element {prog.fifo(a.fifo).elem} is not {at}")
                    elif isinstance(a, ir.BufferRef) and a.name not in bufs:
                        raise ArrayIRError(f"array program {prog.name}: unknown buffer {a.name}")
    args = {a.name: a for a in prog.sequence.args}
    ids = set()
    for op in prog.sequence.ops:
        if not isinstance(op, ir.DmaTask):
            continue
        where = f"runtime task {op.id} ({op.fifo} <- {op.arg})"
        if op.id in ids:
            raise ArrayIRError(f"array program {prog.name}: {where}: task id used twice")
        ids.add(op.id)
        f = prog.fifo(op.fifo)
        shim_end = f.producer if op.direction == "MM2S" else next(
            (c for c in f.consumers if c.kind == "shim"), None)
        if shim_end is None or shim_end.kind != "shim" or shim_end.col != op.column:
            raise ArrayIRError(f"array program {prog.name}: {where}: fifo has no {op.direction} "
                               f"shim endpoint in column {op.column}")
        if op.arg not in args:
            raise ArrayIRError(f"array program {prog.name}: {where}: unknown host arg")
        if len(op.sizes) != len(op.strides) or (op.pad_after and len(op.pad_after) != len(op.sizes)):
            raise ArrayIRError(f"array program {prog.name}: {where}: sizes/strides/pad lengths differ")
        _check_dims(prog, where, tuple(zip(op.sizes, op.strides)), gen.max_dma_dims.value, gen)
        if op.strides and op.strides[-1] != 1 and op.sizes[-1] > 1:
            raise ArrayIRError(f"array program {prog.name}: {where}: innermost stride "
                               f"{op.strides[-1]} must be 1")
        if all(op.sizes):
            hi = op.offset + sum((s - 1) * st for s, st in zip(op.sizes, op.strides))
            n = args[op.arg].type.numel
            if op.offset < 0 or hi >= n:
                raise ArrayIRError(f"array program {prog.name}: {where}: addresses elements "
                                   f"{op.offset}..{hi}, host buffer has {n}")


def _check_balance(prog: ir.ArrayProgram) -> None:
    produced = fifo_elements(prog)
    for f in prog.fifos:
        n = produced.get(f.name)
        if n is None:
            continue
        if n != int(n):
            raise ArrayIRError(f"array program {prog.name}: fifo {f.name}: the runtime sequence "
                               f"sends {n:.3f} elements of {f.elem.shape}, not a whole number")
        for c in f.consumers:
            if c.kind != "compute":
                continue
            core = next((b for b in prog.cores if b.tile == c), None)
            got = count_acquires(core.body, f.name, "consume",
                                 rtp=prog.sequence.rtp_values()) if core else 0
            if got != n:
                raise ArrayIRError(f"array program {prog.name}: fifo {f.name}: {int(n)} elements "
                                   f"per launch, but {c.name} acquires {got}")
