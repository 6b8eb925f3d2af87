"""The array side of the transaction level: object FIFO state (depth-bounded, broadcast to every
consumer), mem-tile links (forward / split / join, re-streaming) and compute cores running their
programs (loops, acquire/release, core-kernel calls) as cooperative generators.

Links and cores hold `ex`, the TxnExecutor (txn.py) that steps them: they read its FIFOs,
buffers, scalars and counts.
"""
from __future__ import annotations

import itertools
from collections import deque

import torch

from torch_xdna.array import ir
from torch_xdna.runtime.sim.txn_faults import LockDeadlock, PatternFault
from torch_xdna.runtime.sim.txn_streams import TORCH_DTYPE, gather, pad_walk, scatter


class FifoState:
    def __init__(self, f: ir.ObjectFifo):
        self.f = f
        self.nbytes = f.elem.nbytes
        self.queues = [deque() for _ in f.consumers]        # stream-form elements per consumer
        self.pending = [deque() for _ in f.consumers]       # released by producer, not yet moved
        self.held_produce = 0
        self.index_of: dict[ir.Tile, int] = {}

    def can_produce(self, n: int = 1) -> bool:
        inflight = max((len(q) for q in self.pending), default=0)
        return self.held_produce + inflight + n <= self.f.depth

    def push(self, stream: torch.Tensor) -> None:
        for p in self.pending:
            p.append(stream)

    def move(self) -> bool:
        """The DMA between producer and consumer buffers: pending -> consumer queues."""
        moved = False
        for q, p in zip(self.queues, self.pending):
            while p and len(q) < self.f.depth:
                q.append(p.popleft())
                moved = True
        return moved

    def consumer_index(self, tile: ir.Tile) -> int:
        hit = self.index_of.get(tile)
        if hit is not None:
            return hit
        try:
            self.index_of[tile] = self.f.consumers.index(tile)
            return self.index_of[tile]
        except ValueError:
            raise PatternFault(f"object FIFO {self.f.name!r}: {tile.name} is not one of its consumers "
                               f"({', '.join(t.name for t in self.f.consumers)})") from None



# --- mem-tile links --------------------------------------------------------------------------------
class MemTileLink:
    """A mem-tile forward / split / join: consumes one element of each source, produces one of
    each destination, with the destinations' dims-to-stream applied to the mem-tile buffer."""

    def __init__(self, ex, ln: ir.FifoLink):
        self.ex, self.ln = ex, ln
        self.srcs = [ex.fifos[s] for s in ln.srcs]
        self.dsts = [ex.fifos[d] for d in ln.dsts]
        mem = self.srcs[0].f.consumers
        self.tile = next((t for t in mem if t.kind == "mem"), mem[0])
        self.src_ci = [s.consumer_index(self.tile) for s in self.srcs]
        self.waiting = ""
        self.held: list | None = None      # emits > 1: the destinations' streams of the held element
        self.sent = 0

    def step(self) -> bool:
        progress = False
        while True:
            if not all(s.queues[ci] for s, ci in zip(self.srcs, self.src_ci)):
                self.waiting = f"mem-tile link {self.ln.srcs}->{self.ln.dsts} waits for input"
                return progress
            if not all(d.can_produce() for d in self.dsts):
                self.waiting = f"mem-tile link {self.ln.srcs}->{self.ln.dsts} waits for space"
                return progress
            self.waiting = ""
            if self.ln.emits > 1:
                self._emit_next()
                progress = True
                continue
            ins = [s.queues[ci].popleft() for s, ci in zip(self.srcs, self.src_ci)]
            if len(self.srcs) == 1:
                buf = self._layout(self.srcs[0], self.src_ci[0], ins[0])
                offs = self.ln.dst_offsets or self.ln.src_offsets or (0,) * len(self.dsts)
                for d, off in zip(self.dsts, offs):
                    out = gather(buf, d.f.dims_to_stream, d.f.walked, d.f.elem.dtype, off)
                    if d.f.pad_dims:          # the mem tile's MM2S BD pads (padDimensions)
                        out = pad_walk(out, d.f.dims_to_stream, d.f.pad_dims, d.f.elem.dtype)
                    d.push(out.clone())
            else:
                d = self.dsts[0]
                buf = torch.zeros(d.nbytes, dtype=torch.uint8)
                offs = self.ln.src_offsets or self.ln.dst_offsets
                for s, ci, x, off in zip(self.srcs, self.src_ci, ins, offs):
                    dims = s.f.dims_from_stream[ci] if s.f.dims_from_stream else ()
                    scatter(buf, x, dims, s.f.elem.numel, s.f.elem.dtype, off)
                d.push(gather(buf, d.f.dims_to_stream, d.f.elem.numel, d.f.elem.dtype).clone())
            progress = True

    def _emit_next(self) -> None:
        """A re-streaming split/forward: the source element stays held (it keeps its buffer
        slot) while each destination's pattern walks it as `emits` elements, one per step."""
        s, ci = self.srcs[0], self.src_ci[0]
        if self.held is None:
            buf = self._layout(s, ci, s.queues[ci][0])
            offs = self.ln.dst_offsets or self.ln.src_offsets or (0,) * len(self.dsts)
            self.held = [gather(buf, d.f.dims_to_stream, d.f.elem.numel * self.ln.emits,
                                d.f.elem.dtype, off) for d, off in zip(self.dsts, offs)]
            self.sent = 0
        for d, whole in zip(self.dsts, self.held):
            n = d.nbytes
            d.push(whole[self.sent * n:(self.sent + 1) * n].clone())
        self.sent += 1
        if self.sent == self.ln.emits:
            s.queues[ci].popleft()
            self.held = None

    @staticmethod
    def _layout(s: FifoState, ci: int, stream: torch.Tensor) -> torch.Tensor:
        dims = s.f.dims_from_stream[ci] if s.f.dims_from_stream else ()
        if not dims:
            return stream
        buf = torch.zeros(s.nbytes, dtype=torch.uint8)
        scatter(buf, stream, dims, s.f.elem.numel, s.f.elem.dtype)
        return buf



# --- cores -----------------------------------------------------------------------------------------
class CoreProcess:
    """A compute core running its program: a generator that yields whenever it blocks."""

    def __init__(self, ex, body: ir.CoreBody):
        self.ex, self.body, self.tile = ex, body, body.tile
        self.held: dict[tuple[str, str], deque] = {}
        self.ring: dict[str, deque] = {}
        self.blocked: tuple[str, str] | None = None
        self.waiting = ""
        self.ops_done = 0
        self.gen = self._run(body.body)
        self.finished = False
        self.ports: dict[str, str] = {}         # fifo -> this core's side of it

    def step(self) -> bool:
        if self.finished:
            return False
        before = self.ops_done
        try:
            next(self.gen)
        except StopIteration:
            self.finished = True
            self.blocked = None
            return self.ops_done != before or True
        return self.ops_done != before

    def _run(self, ops):
        for op in ops:
            if isinstance(op, ir.Loop):
                counter = (itertools.count() if op.count is None else
                           range(int(self._scalar(op.count.name))) if isinstance(op.count, ir.ScalarRef)
                           else range(op.count))
                for _ in counter:
                    yield from self._run(op.body)
            elif isinstance(op, ir.Acquire):
                yield from self._acquire(op)
            elif isinstance(op, ir.Release):
                self._release(op)
            elif isinstance(op, ir.Call):
                self._call(op)
            self.ops_done += 1

    def _acquire(self, op: ir.Acquire):
        fs = self.ex.fifos[op.fifo]
        held = self.held.setdefault((op.fifo, op.port), deque())
        while len(held) < op.n:
            if op.port == "consume":
                ci = fs.consumer_index(self.tile)
                q = fs.queues[ci]
                if q:
                    stream = q.popleft()
                    dims = fs.f.dims_from_stream[ci] if fs.f.dims_from_stream else ()
                    if dims:
                        buf = torch.zeros(fs.nbytes, dtype=torch.uint8)
                        scatter(buf, stream, dims, fs.f.elem.numel, fs.f.elem.dtype)
                    else:
                        buf = stream.clone()
                    held.append(buf)
                    continue
            else:
                if fs.f.producer != self.tile:
                    raise PatternFault(f"{self.tile.name} acquires {op.fifo!r} to produce, but its producer is "
                                       f"{fs.f.producer.name}")
                if fs.can_produce():
                    ring = self.ring.setdefault(op.fifo, deque(
                        torch.zeros(fs.nbytes, dtype=torch.uint8) for _ in range(fs.f.depth)))
                    buf = ring[0]
                    ring.rotate(-1)
                    held.append(buf)
                    fs.held_produce += 1
                    continue
            self.blocked = (op.fifo, op.port)
            self.waiting = f"{self.tile.name} blocked acquiring {op.fifo!r} ({op.port})"
            yield
        self.blocked = None
        self.waiting = ""

    def _release(self, op: ir.Release) -> None:
        fs = self.ex.fifos[op.fifo]
        held = self.held.get((op.fifo, op.port), deque())
        if len(held) < op.n:
            raise LockDeadlock(f"xdna txn: {self.tile.name} releases {op.n} element(s) of {op.fifo!r} "
                               f"({op.port}) but holds {len(held)}: the lock would go negative")
        for _ in range(op.n):
            buf = held.popleft()
            if op.port == "produce":
                fs.held_produce -= 1
                fs.push(gather(buf, fs.f.dims_to_stream, fs.f.elem.numel, fs.f.elem.dtype).clone())

    def _call(self, op: ir.Call) -> None:
        fn = self.ex.kernels(op.kernel)
        args = []
        for a in op.args:
            if isinstance(a, ir.FifoElem):
                fs = self.ex.fifos[a.fifo]
                port = self.ports.get(a.fifo)
                if port is None:
                    port = self.ports[a.fifo] = "produce" if fs.f.producer == self.tile else "consume"
                held = self.held.get((a.fifo, port), deque())
                if a.index >= len(held):
                    raise LockDeadlock(f"xdna txn: {self.tile.name} calls {op.kernel} on element {a.index} "
                                       f"of {a.fifo!r} without holding it (acquired {len(held)})")
                args.append(typed(held[a.index], fs.f.elem))
            elif isinstance(a, ir.BufferRef):
                ty = self.ex.buffer_types.get(a.name)
                if ty is None:
                    ty = self.ex.p.buffer(a.name).type          # raises, naming the buffer
                args.append(typed(self.ex.buffers[a.name], ty))
            elif isinstance(a, ir.Const):
                args.append(a.value)
            elif isinstance(a, ir.ScalarRef):
                args.append(self._scalar(a.name))
        if getattr(fn, "wants_call", False):     # references that need the call's argument kinds
            fn(*args, call=op, program=self.ex.p)
        else:
            fn(*args)
        self.ex.counts["kernel_calls"] += 1

    def _scalar(self, name: str):
        if name in self.ex.scalars:
            return self.ex.scalars[name]
        try:
            b = self.ex.p.buffer(name)
        except KeyError:
            raise PatternFault(f"xdna txn: {self.tile.name}: scalar {name!r} is neither a launch scalar nor "
                               f"an RTP buffer") from None
        return typed(self.ex.buffers[name], b.type).reshape(-1)[0].item()


def typed(buf: torch.Tensor, t: ir.TensorType) -> torch.Tensor:
    dt = TORCH_DTYPE[t.dtype]
    if t.dtype == "i4":
        return buf                       # packed nibbles: the kernel unpacks
    return buf.view(dt).reshape(t.shape)

