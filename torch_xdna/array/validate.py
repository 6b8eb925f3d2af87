"""Check an ArrayProgram against its generation's limits, and count what it uses.

Counting rules (those of mlir-aie's object-FIFO lowering on AIE-ML):
  memory  every fifo endpoint on a core or mem tile allocates depth x element bytes, except that
          at a mem-tile link only the single side allocates (a split's source, a join's
          destination, a forward's source): the other side addresses it at offsets. Shim
          endpoints are DDR. Static buffers add their bytes.
  BDs     depth per fifo endpoint on a DMA tile (one BD per buffer, chained); shim BDs are the
          runtime sequence's tasks in flight at once.
  locks   two per fifo endpoint on a core or mem tile (producer and consumer semaphores).
  channels  a fifo takes one MM2S channel at its producer and one S2MM at each consumer.
Also checked: access patterns (dims, strides), every task's fifo/arg/column/direction, offsets
inside the host buffer, and that each fifo carries as many elements per launch as its consumers
acquire. Errors name the program, the tile or op, the limit and both numbers.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from torch_xdna.array import ir
from torch_xdna.hw import Generation, get_generation
from torch_xdna.hw.aie2p_regs import SHIM_BDS as _SHIM_BDS

SHIM_BDS = _SHIM_BDS.value       # shim tile BDs (hw/aie2p_regs.py, with its source)
CORE_DMA_DIMS = 3      # AIE-ML compute-tile DMA: 3-D addressing (AM020; mem tile and shim: 4-D)


class ArrayIRError(ValueError):
    """An ArrayProgram breaks a hardware limit or is inconsistent."""


@dataclass
class Usage:
    """What one program uses, per tile (keyed by tile name) and in total."""

    memory: dict = field(default_factory=dict)       # tile -> bytes
    bds: dict = field(default_factory=dict)
    locks: dict = field(default_factory=dict)
    channels: dict = field(default_factory=dict)     # tile -> (in, out)
    shim_bds_in_flight: dict = field(default_factory=dict)   # column -> max BDs in flight
    shim_queue: dict = field(default_factory=dict)   # (col, dir, ch) -> max tasks queued
    tasks: int = 0
    awaits: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def max_of(self, table: str, kind: str, prog: ir.ArrayProgram) -> int:
        names = {t.name for t in prog.tiles if t.kind == kind}
        vals = [v for k, v in getattr(self, table).items() if k in names]
        return max(vals, default=0)


def _allocating_sides(prog: ir.ArrayProgram) -> set[tuple[str, str]]:
    """(fifo, tile name) pairs at mem-tile links that do NOT allocate their own buffers."""
    skip = set()
    for ln in prog.links:
        shared = ln.srcs if ln.kind == "join" else ln.dsts
        for n in shared:
            f = prog.fifo(n)
            if n in ln.dsts:
                mem = f.producer
            else:
                mem = next((c for c in f.consumers if c.kind == "mem"), None)
            if mem is not None:
                skip.add((n, mem.name))
    return skip


def usage(prog: ir.ArrayProgram) -> Usage:
    u = Usage()
    skip = _allocating_sides(prog)
    mem, bds, locks = Counter(), Counter(), Counter()
    ch_in, ch_out = Counter(), Counter()
    for f in prog.fifos:
        ch_out[f.producer.name] += 1
        for c in f.consumers:
            ch_in[c.name] += 1
        for t in f.endpoints:
            if t.kind == "shim":
                continue
            if (f.name, t.name) not in skip:
                mem[t.name] += f.depth * f.elem.nbytes
            bds[t.name] += f.depth
            locks[t.name] += 2
    for b in prog.buffers:
        mem[b.tile.name] += b.type.nbytes
    for t in prog.tiles:
        u.memory[t.name] = mem[t.name]
        u.bds[t.name] = bds[t.name]
        u.locks[t.name] = locks[t.name]
        u.channels[t.name] = (ch_in[t.name], ch_out[t.name])
    # runtime sequence: tasks in flight per shim and per channel queue
    live: dict[int, ir.DmaTask] = {}
    peak_bd, peak_q = Counter(), Counter()
    args = {a.name: a for a in prog.sequence.args}
    for op in prog.sequence.ops:
        if isinstance(op, ir.DmaTask):
            live[op.id] = op
            u.tasks += 1
            nbytes = op.elements * ir.DTYPE_BITS[args[op.arg].type.dtype] // 8 if op.arg in args else 0
            if op.direction == "MM2S":
                u.bytes_in += nbytes
            else:
                u.bytes_out += nbytes
            per_col = Counter(t.column for t in live.values())
            per_q = Counter((t.column, t.direction, t.channel) for t in live.values())
            for k, v in per_col.items():
                peak_bd[k] = max(peak_bd[k], v)
            for k, v in per_q.items():
                peak_q[k] = max(peak_q[k], v)
        elif isinstance(op, (ir.Await, ir.Free)):
            u.awaits += isinstance(op, ir.Await)
            for t in op.tasks:
                live.pop(t, None)
    u.shim_bds_in_flight = dict(peak_bd)
    u.shim_queue = dict(peak_q)
    return u


def _fail(prog, where, limit, needed, available, hint=""):
    msg = (f"array program {prog.name}: {where}: {limit} exceeded: needs {needed}, "
           f"hardware has {available}")
    raise ArrayIRError(msg + (f". {hint}" if hint else ""))


def validate(prog: ir.ArrayProgram, gen: Generation | None = None) -> Usage:
    """Raise ArrayIRError on the first broken limit or inconsistency; return the usage."""
    gen = gen or get_generation(prog.generation)
    _check_refs(prog, gen)
    u = usage(prog)
    limits = {"compute": (gen.l1_usable, gen.core_bds.value, gen.core_locks.value,
                          gen.core_dma_channels.value),
              "mem": (gen.memtile_bytes.value, gen.memtile_bds.value, gen.memtile_locks.value,
                      gen.memtile_dma_channels.value),
              "shim": (0, 0, 0, gen.shim_dma_channels.value)}
    for t in prog.tiles:
        memory, nbd, nlock, (cin, cout) = limits[t.kind]
        if t.kind != "shim":
            if u.memory[t.name] > memory:
                _fail(prog, t.name, "L1 data memory (64 KiB minus stack)" if t.kind == "compute"
                      else "mem tile memory", u.memory[t.name], memory)
            if u.bds[t.name] > nbd:
                _fail(prog, t.name, "buffer descriptors", u.bds[t.name], nbd)
            if u.locks[t.name] > nlock:
                _fail(prog, t.name, "locks", u.locks[t.name], nlock)
        uin, uout = u.channels[t.name]
        if uin > cin:
            _fail(prog, t.name, "DMA S2MM (input) channels", uin, cin)
        if uout > cout:
            _fail(prog, t.name, "DMA MM2S (output) channels", uout, cout)
    for col, n in u.shim_bds_in_flight.items():
        if n > SHIM_BDS:
            _fail(prog, f"shim column {col}", "shim BDs in flight", n, SHIM_BDS)
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
        md = CORE_DMA_DIMS if f.producer.kind == "compute" else gen.max_dma_dims.value
        _check_dims(prog, f"fifo {f.name} dims_to_stream", f.dims_to_stream, md, gen)
        if f.dims_to_stream:
            reach = sum((s - 1) * st for s, st in f.dims_to_stream) + 1
            if prog.link_of(f.name) is None and reach > f.elem.numel:
                raise ArrayIRError(f"array program {prog.name}: fifo {f.name}: access pattern "
                                   f"reaches element {reach}, buffer has {f.elem.numel}")
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
        for op in _walk(core.body):
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


def _walk(body):
    for op in body:
        yield op
        if isinstance(op, ir.Loop):
            yield from _walk(op.body)


def _count(body, fifo: str, port: str, times: int = 1) -> int:
    n = 0
    for op in body:
        if isinstance(op, ir.Loop):
            n += _count(op.body, fifo, port, times * (op.count if op.count is not None else 1))
        elif isinstance(op, ir.Acquire) and op.fifo == fifo and op.port == port:
            n += op.n * times
    return n


def fifo_elements(prog: ir.ArrayProgram) -> dict[str, int]:
    """Elements each fifo carries per launch, from its producer side."""
    args = {a.name: a for a in prog.sequence.args}
    out: dict[str, int] = {}
    sent = defaultdict(int)
    for op in prog.sequence.tasks:
        if op.direction == "MM2S":
            bits = ir.DTYPE_BITS[args[op.arg].type.dtype]
            sent[op.fifo] += op.stream_elements * bits
    pending = list(prog.fifos)
    for _ in range(len(pending) + 2):
        rest = []
        for f in pending:
            n = None
            bits = f.elem.numel * ir.DTYPE_BITS[f.elem.dtype]
            if f.producer.kind == "shim":
                n = sent[f.name] / bits if bits else 0
            elif f.producer.kind == "compute":
                core = next((c for c in prog.cores if c.tile == f.producer), None)
                n = _count(core.body, f.name, "produce") if core else 0
            else:
                ln = prog.link_of(f.name)
                if ln is None:
                    n = 0
                else:
                    srcs = [out.get(s) for s in ln.srcs]
                    if all(s is not None for s in srcs):
                        n = srcs[0] * ln.emits
            if n is None:
                rest.append(f)
            else:
                out[f.name] = n
        pending = rest
        if not pending:
            break
    return out


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
            got = _count(core.body, f.name, "consume") if core else 0
            if got != n:
                raise ArrayIRError(f"array program {prog.name}: fifo {f.name}: {int(n)} elements "
                                   f"per launch, but {c.name} acquires {got}")
