"""What an ArrayProgram uses, counted the way mlir-aie's object-FIFO lowering allocates it.

Counting rules (AIE-ML; Xilinx/mlir-aie lib/Dialect/AIE/Transforms/
AIEObjectFifoStatefulTransform.cpp, index version, createObjectFifoElements / createDMA):
  memory  every fifo endpoint on a core or mem tile allocates depth x element bytes, except that
          at a mem-tile link only the single side allocates (a split's source, a join's
          destination, a forward's source, sized for the larger element): the other side
          addresses it at offsets. Shim
          endpoints are DDR. Static buffers add their bytes.
  BDs     depth per fifo endpoint on a DMA tile (one BD per buffer, chained; with `repeats`,
          upstream's expansion of a repeat count, endpoint_bds); shim BDs are the
          runtime sequence's tasks in flight at once.
  locks   two per fifo endpoint on a core or mem tile (producer and consumer semaphores).
  channels  a fifo takes one MM2S channel at its producer and one S2MM at each consumer.
array/validate.py (consistency, the plan's budget) and array/rules.py (upstream's limits) both
read these counts; neither counts again.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from torch_xdna.array import ir


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


def allocating_sides(prog: ir.ArrayProgram) -> set[tuple[str, str]]:
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


def _link_elem_bytes(prog: ir.ArrayProgram, f: ir.ObjectFifo, tile: ir.Tile) -> int:
    """Bytes of one buffer of `f` on `tile`: a forward's source buffer holds the larger of the
    two elements (a padded forward sends more than it receives: Xilinx/mlir-aie test/objectFifo-
    stateful-transform/memtile_padding_test.mlir @ 49505269454190a06a9c52a2ef465c9e2d30c27d
    allocates its 56x56 -> 64x64 link's mem-tile buffers at 64x64)."""
    ln = prog.link_of(f.name) if tile.kind == "mem" else None
    if ln is None or ln.kind != "forward" or f.name not in ln.srcs:
        return f.elem.nbytes
    return max(f.elem.nbytes, prog.fifo(ln.dsts[0]).elem.nbytes)


def endpoint_bds(prog: ir.ArrayProgram, f: ir.ObjectFifo, tile: ir.Tile) -> int:
    """BDs mlir-aie's stateful transform chains for one fifo endpoint: one per buffer, and on
    the producer of a fifo with a repeat count each BD repeat_count times, unless the depth is 1
    (then one BD and the channel's hardware repeat: Xilinx/mlir-aie test/objectFifo-stateful-
    transform/repeat_count/hw_repeat_optimization_test.mlir @ b1030a43f0f7c26a06c8e68d727aef2ad2768d31)."""
    rep = prog.repeat_count(f.name) if tile == f.producer else 1
    return f.depth if f.depth == 1 else f.depth * rep


def usage(prog: ir.ArrayProgram, repeats: bool = False) -> Usage:
    """Counts per tile; `repeats`: BDs as upstream expands repeat counts (endpoint_bds), else
    one per buffer (the plan's count)."""
    u = Usage()
    skip = allocating_sides(prog)
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
                mem[t.name] += f.depth * _link_elem_bytes(prog, f, t)
            bds[t.name] += endpoint_bds(prog, f, t) if repeats else f.depth
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


def walk(body):
    for op in body:
        yield op
        if isinstance(op, ir.Loop):
            yield from walk(op.body)


def count_acquires(body, fifo: str, port: str, times: int = 1,
                   rtp: dict | None = None) -> int:
    """Elements a core body acquires from `fifo` per launch (forever loops count once; runtime
    trip counts are read from `rtp`, the launch's RTP slot values)."""
    n = 0
    for op in body:
        if isinstance(op, ir.Loop):
            trips = op.trips(rtp or {})
            n += count_acquires(op.body, fifo, port, times * (trips if trips is not None else 1), rtp)
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
                n = count_acquires(core.body, f.name, "produce", rtp=prog.sequence.rtp_values()) \
                    if core else 0
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


