"""The transaction level of the `sim` backend: execute a launch's instruction stream.

The functional level runs a design's whole-tensor reference. This level runs what the NPU would:
it decodes the launch's stream (array/txn.py), keeps each shim column's BD registers, applies DDR
patches, and on task-queue pushes executes the BDs against the launch's host buffers (strided
word reads/writes exactly as the BD fields say). Data moves through the design's object FIFOs
(depth-bounded, broadcast to every consumer, dims-to/from-stream transforms), mem-tile
forward/split/join links, and each core's program (loops, acquire/release, kernel calls) runs the
registered core-kernel references (core_kernels.py) on its tile buffers. Syncs wait for tokens.
What the chip or driver would reject becomes a named fault (txn_faults.py).

Scheduling is cooperative and deterministic: processes (shim channels, links, cores) run until
none can progress; a sync returns when its token arrives, else the stall is diagnosed.
"""
from __future__ import annotations

import itertools
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import torch

from torch_xdna.array import ir
from torch_xdna.array import txn as T
from torch_xdna.hw import aie2p_regs as R
from torch_xdna.runtime.sim import core_kernels
from torch_xdna.runtime.sim.txn_faults import (AddressFault, BdBusy, BdExhausted, LockDeadlock,
                                               MissingSync, PatternFault, SyncTimeout,
                                               TaskQueueOverflow, TxnFault)

TORCH_DTYPE = {"bf16": torch.bfloat16, "f32": torch.float32, "i8": torch.int8, "i16": torch.int16,
               "i32": torch.int32, "u8": torch.uint8, "u32": torch.int32, "i4": torch.uint8,
               "f16": torch.float16, "i64": torch.int64}
QUEUE_DEPTH = 4          # hw Generation.shim_task_queue_depth (passed in by the device)


def elem_bytes(dtype: str) -> float:
    return ir.DTYPE_BITS[dtype] / 8


# --- index patterns (cached) -----------------------------------------------------------------------
_IDX: dict[tuple, torch.Tensor] = {}


def _pattern_index(dims: ir.Dims, count: int, base: int = 0) -> torch.Tensor:
    """Element indices of a (size, stride) pattern, outermost first; () = contiguous."""
    key = (dims, count, base)
    hit = _IDX.get(key)
    if hit is not None:
        return hit
    if not dims:
        idx = torch.arange(base, base + count)
    else:
        idx = torch.zeros((), dtype=torch.long)
        for size, stride in dims:
            idx = idx.unsqueeze(-1) + torch.arange(size) * stride
        idx = idx.reshape(-1) + base
        if idx.numel() != count:
            # a pattern covering fewer/more elements than the buffer: repeat/truncate as the
            # DMA would wrap; mlir-aie requires equality, so we insist
            raise PatternFault(f"access pattern {dims} yields {idx.numel()} elements, the object "
                               f"FIFO element holds {count}")
    if len(_IDX) > 2048:
        _IDX.clear()
    _IDX[key] = idx
    return idx


def _byte_index(elem_idx: torch.Tensor, nbytes: int) -> torch.Tensor:
    return (elem_idx.unsqueeze(-1) * nbytes + torch.arange(nbytes)).reshape(-1)


_BYTES: dict[tuple, tuple[torch.Tensor, int]] = {}


def _pattern_bytes(dims: ir.Dims, count: int, base: int, nbytes: int) -> tuple[torch.Tensor, int]:
    """Byte indices of a pattern of `nbytes`-byte elements and their maximum (cached, like
    _pattern_index)."""
    key = (dims, count, base, nbytes)
    hit = _BYTES.get(key)
    if hit is None:
        if len(_BYTES) > 2048:
            _BYTES.clear()
        idx = _byte_index(_pattern_index(dims, count, base), nbytes)
        hit = _BYTES[key] = (idx, int(idx.max()) if idx.numel() else -1)
    return hit


def gather(buf: torch.Tensor, dims: ir.Dims, count: int, dtype: str, base: int = 0) -> torch.Tensor:
    """Stream bytes read from element buffer `buf` (uint8) with a dims-to-stream pattern."""
    b = elem_bytes(dtype)
    if not dims:
        lo = int(base * b)
        return buf[lo:lo + int(count * b)]
    if b < 1:
        raise PatternFault(f"{dtype} object FIFO with a data-layout transform: sub-byte elements "
                           f"cannot be re-laid out by the DMA")
    idx, top = _pattern_bytes(dims, count, base, int(b))
    if top >= buf.numel():
        raise PatternFault(f"dims {dims} at offset {base} reach element {top // int(b)} of a "
                           f"{buf.numel() // int(b)}-element buffer")
    return buf[idx]


def scatter(buf: torch.Tensor, stream: torch.Tensor, dims: ir.Dims, count: int, dtype: str,
            base: int = 0) -> None:
    b = elem_bytes(dtype)
    if not dims:
        lo = int(base * b)
        buf[lo:lo + stream.numel()] = stream
        return
    buf[_pattern_bytes(dims, count, base, int(b))[0]] = stream


_PADS: dict = {}


def pad_map(task: ir.DmaTask) -> torch.Tensor | None:
    """For a task with pad_after: per stream element (one repeat), its data index or -1
    (cached per task: a design's streams repeat their tasks launch after launch)."""
    if not task.pad_after or not any(task.pad_after):
        return None
    hit = _PADS.get(task)
    if hit is None:
        if len(_PADS) > 8192:
            _PADS.clear()
        hit = _PADS[task] = _pad_map(task)
    return hit


def _pad_map(task: ir.DmaTask) -> torch.Tensor:
    block = torch.zeros(1, dtype=torch.long)          # one element, data index 0
    n_data = 1
    for s, p in zip(reversed(task.sizes), reversed(task.pad_after)):
        live = (block >= 0).unsqueeze(0)
        reps = torch.where(live, block.unsqueeze(0) + (torch.arange(s) * n_data).unsqueeze(1),
                           block.unsqueeze(0)).reshape(-1)       # s copies, data indices shifted
        pad = torch.full((p * block.numel(),), -1, dtype=torch.long)
        block = torch.cat([reps, pad])
        n_data *= s
    return block


# --- state ---------------------------------------------------------------------------------------
@dataclass
class _Task:
    """One pushed BD execution on a shim channel."""

    op_index: int
    column: int
    direction: str
    channel: int
    bd_id: int
    bd: T.ShimBD
    arg_idx: int
    offset: int                 # bytes into the host buffer
    repeat_count: int
    token: bool
    ir_task: ir.DmaTask | None
    done: bool = False
    freed: bool = False
    synced: bool = False
    stream: torch.Tensor | None = None     # MM2S: bytes still to emit
    pos: int = 0
    taken: list = field(default_factory=list)   # S2MM: stream pieces received
    taken_bytes: int = 0


class _FifoState:
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


class TxnExecutor:
    """Runs one launch: `program` (the design's IR), its stream words, its host buffers."""

    def __init__(self, program: ir.ArrayProgram, words: Sequence[int], host: Sequence[torch.Tensor],
                 scalars: dict | None = None, queue_depth: int = QUEUE_DEPTH, timeout_ms: int = 2000,
                 fold_ddr_offset: bool = True, kernels: core_kernels.KernelRegistry | None = None):
        self.p = program
        # the core kernels' implementations: torch references (sim), host-compiled C++ (emulated)
        self.kernels = kernels.lookup if kernels is not None else core_kernels.lookup
        self.words = list(words)
        self.host = [h.reshape(-1).view(torch.uint8) if h.dtype != torch.uint8 else h.reshape(-1)
                     for h in host]
        self.scalars = dict(scalars or {})
        self.queue_depth = queue_depth
        self.timeout_ms = timeout_ms
        self.fold = fold_ddr_offset
        self.fifos = {f.name: _FifoState(f) for f in program.fifos}
        self.bds: dict[tuple[int, int], list[int]] = {}
        self.patched: dict[tuple[int, int], tuple[int, int]] = {}
        self.busy: dict[tuple[int, int], _Task] = {}
        self.queues: dict[tuple[int, str, int], deque[_Task]] = {}
        self.tokens: dict[tuple[int, str, int], int] = {}
        self.tasks: list[_Task] = []
        self.open: list[_Task] = []       # tasks not yet freed (or, S2MM, not yet synced)
        self.carry: dict[tuple[int, str, int], _Carry] = {}
        self.counts = {"bd_writes": 0, "patches": 0, "pushes": 0, "syncs": 0, "kernel_calls": 0,
                       "mm2s_bytes": 0, "s2mm_bytes": 0}
        # static configuration: which fifo each shim channel feeds/drains, IR tasks per channel
        self.chan_fifo: dict[tuple[int, str, int], str] = {}
        self.ir_tasks: dict[tuple[int, str, int], deque[ir.DmaTask]] = {}
        for t in program.sequence.tasks:
            key = (t.column, t.direction, t.channel)
            prev = self.chan_fifo.setdefault(key, t.fifo)
            if prev != t.fifo:
                raise PatternFault(f"{program.name}: shim column {t.column} {t.direction} channel "
                                   f"{t.channel} serves fifos {prev!r} and {t.fifo!r}")
            self.ir_tasks.setdefault(key, deque()).append(t)
        self.fifo_chan = {v: k for k, v in self.chan_fifo.items()}
        self.buffers = {b.name: torch.zeros(int(b.type.nbytes), dtype=torch.uint8) for b in program.buffers}
        self.buffer_types = {b.name: b.type for b in program.buffers}
        self.chan_ci: dict[tuple[int, str, int], int] = {}
        self.rtp_addr = {}
        for name, (tile, base) in T.rtp_layout(program).items():
            buf = program.buffer(name)
            for i in range(max(1, buf.type.nbytes // 4)):
                self.rtp_addr[R.tile_address(tile.col, tile.row, base + 4 * i)] = (name, i)
        self.op_index = -1                  # pads queued before any op name op -1
        for chan in self.ir_tasks:
            self._flush_pads(chan)
        self.cores = [_Core(self, c) for c in program.cores]
        self.links = [_Link(self, ln) for ln in program.links]

    # --- stream ops ---------------------------------------------------------------------------
    def run(self) -> dict:
        tx = T.decode(self.words)
        for k, op in enumerate(tx.ops):
            self.op_index = k
            if isinstance(op, T.BlockWrite):
                self._blockwrite(k, op)
            elif isinstance(op, T.DdrPatch):
                self._patch(k, op)
            elif isinstance(op, T.Write32):
                self._write32(k, op)
            elif isinstance(op, T.MaskWrite32):
                loc = T.queue_register(op.addr)
                if loc is None:
                    continue             # channel control (token controller id): no data effect
            elif isinstance(op, T.Sync):
                self._sync(k, op)
            # preempt / load_pdi: no data effect at this level
        self._finish(len(tx.ops))
        return self.counts

    def _blockwrite(self, k: int, op: T.BlockWrite) -> None:
        loc = T.bd_register(op.addr)
        if loc is None:
            return                        # not a shim BD (e.g. mem-tile config): no launch data
        col, bd_id, word = loc
        if word != 0 or len(op.data) != R.SHIM_BD_WORDS.value:
            raise PatternFault(f"op {k} (blockwrite): writes {len(op.data)} words at word {word} of shim "
                               f"column {col} BD {bd_id}; a BD is written whole (8 words from word 0)")
        self._check_free(k, col, bd_id, "blockwrite")
        self.bds[(col, bd_id)] = list(op.data)
        self.patched.pop((col, bd_id), None)
        self.counts["bd_writes"] += 1

    def _check_free(self, k: int, col: int, bd_id: int, what: str) -> None:
        t = self.busy.get((col, bd_id))
        if t is None or t.freed:
            return
        in_flight = sum(1 for (c, _), x in self.busy.items() if c == col and not x.freed)
        cls, hint = (BdExhausted, f"all {R.SHIM_BDS.value} BDs of column {col} are in flight: wait on "
                     f"tasks (sync) before issuing more") if in_flight >= R.SHIM_BDS.value else \
            (BdBusy, "use a free BD id or wait on the task (sync) before reusing it")
        raise cls(f"xdna txn: op {k} ({what}): shim column {col} BD {bd_id} is still in flight for the "
                  f"task pushed by op {t.op_index} ({t.direction} channel {t.channel}); field bd_id reused "
                  f"while busy; {hint}")

    def _patch(self, k: int, op: T.DdrPatch) -> None:
        loc = T.bd_register(op.addr)
        if loc is None or loc[2] * 4 != R.SHIM_BD_ADDR_OFFSET.value:
            raise PatternFault(f"xdna txn: op {k} (ddr_patch): address 0x{op.addr:08X} is not a shim BD's "
                               f"base-address register (BD word {R.SHIM_BD_ADDR_OFFSET.value // 4})")
        if op.arg_idx >= len(self.host):
            raise AddressFault(f"xdna txn: op {k} (ddr_patch): field arg_idx={op.arg_idx} but the launch "
                               f"binds {len(self.host)} host buffers")
        plus = op.arg_plus
        if self.fold and op.arg_idx >= R.DDR_FOLD_FIRST_ARG.value and plus >= R.DDR_FOLD_OFFSET.value:
            plus -= R.DDR_FOLD_OFFSET.value
        self.patched[(loc[0], loc[1])] = (op.arg_idx, plus)
        self.counts["patches"] += 1

    def _write32(self, k: int, op: T.Write32) -> None:
        push = T.decode_push(op)
        if push is not None:
            self._push(k, push)
            return
        rtp = self.rtp_addr.get(op.addr)
        if rtp is not None:
            name, i = rtp
            self.buffers[name][4 * i:4 * i + 4] = torch.tensor(list(struct.pack("<I", op.value)),
                                                               dtype=torch.uint8)
            return
        loc = T.bd_register(op.addr)
        if loc is not None:               # a single BD word rewritten
            col, bd_id, word = loc
            self._check_free(k, col, bd_id, "write32")
            self.bds.setdefault((col, bd_id), [0] * R.SHIM_BD_WORDS.value)[word] = op.value

    def _push(self, k: int, p: T.QueuePush) -> None:
        key = (p.column, p.bd_id)
        words = self.bds.get(key)
        if words is None:
            raise PatternFault(f"xdna txn: op {k} (task-queue push, column {p.column} {p.direction} channel "
                               f"{p.channel}): field start_bd_id={p.bd_id} names a BD the stream never wrote")
        bd = T.unpack_shim_bd(words)
        if not bd.valid_bd:
            raise PatternFault(f"xdna txn: op {k} (task-queue push): BD {p.bd_id} on column {p.column} has "
                               f"valid_bd=0 (the DMA reports ERROR_BD_INVALID)")
        self._check_free(k, p.column, p.bd_id, "task-queue push")
        if key not in self.patched:
            raise AddressFault(f"xdna txn: op {k} (task-queue push): BD {p.bd_id} on column {p.column} was "
                               f"never DDR-patched: its base address 0x{bd.base_address_low:08X} lies in no "
                               f"host buffer (add a ddr_patch for the BD's word 1)")
        arg_idx, plus = self.patched[key]
        chan = (p.column, p.direction, p.channel)
        if chan not in self.chan_fifo:
            raise PatternFault(f"xdna txn: op {k} (task-queue push): column {p.column} {p.direction} channel "
                               f"{p.channel} carries no object FIFO of design {self.p.name!r}")
        ir_task = self._next_ir_task(chan)
        q = self.queues.setdefault(chan, deque())
        outstanding = sum(1 for t in q if not t.done and t.bd_id >= 0)
        if outstanding >= self.queue_depth:
            self._quiesce()
            outstanding = sum(1 for t in q if not t.done and t.bd_id >= 0)
            if outstanding >= self.queue_depth:
                raise TaskQueueOverflow(
                    f"xdna txn: op {k} (task-queue push): column {p.column} {p.direction} channel "
                    f"{p.channel} already holds {outstanding} unfinished tasks (queue depth "
                    f"{self.queue_depth}); wait on a task before pushing more")
        offset = plus + bd.base_address_low + (bd.base_address_high << 32)
        task = _Task(k, p.column, p.direction, p.channel, p.bd_id, bd, arg_idx, offset, p.repeat_count,
                     p.issue_token, ir_task)
        self._check_bounds(task)
        if ir_task is not None:
            data_bytes = bd.buffer_length * 4 * (p.repeat_count + 1)
            want = _data_bytes(ir_task, self._arg_dtype(ir_task))
            if data_bytes != want:
                raise PatternFault(
                    f"xdna txn: op {k} (task-queue push): BD {p.bd_id} on column {p.column} moves {data_bytes} "
                    f"bytes (buffer_length={bd.buffer_length} words x {p.repeat_count + 1} runs) but dma task "
                    f"{ir_task.id} of fifo {ir_task.fifo!r} carries {want}: field buffer_length/repeat_count "
                    f"disagrees with the design")
        self.busy[key] = task
        q.append(task)
        self._flush_pads(chan)
        self.tasks.append(task)
        self.open.append(task)
        self.counts["pushes"] += 1

    def _next_ir_task(self, chan) -> ir.DmaTask | None:
        self._flush_pads(chan)
        q = self.ir_tasks.get(chan)
        return q.popleft() if q else None

    def _flush_pads(self, chan) -> None:
        """All-padding tasks next in a channel's order: the mem-tile DMA emits (or drops) their
        zeros with no shim BD, so they queue without a push."""
        q = self.ir_tasks.get(chan)
        while q and _data_elems(q[0]) == 0:
            pad = q.popleft()
            self.queues.setdefault(chan, deque()).append(_Task(
                self.op_index, chan[0], chan[1], chan[2], -1, T.ShimBD(0), 0, 0, 0, False, pad))

    def _arg_dtype(self, t: ir.DmaTask) -> str:
        for a in self.p.sequence.args:
            if a.name == t.arg:
                return a.type.dtype
        raise PatternFault(f"dma task {t.id}: unknown argument {t.arg!r}")

    def _check_bounds(self, task: _Task) -> None:
        box = _bd_box(task.bd, task.repeat_count)
        if box is not None:
            base, dims = box
            lo = task.offset + base * 4
            hi = lo + (sum((n - 1) * st for n, st in dims) + 1) * 4
        else:
            offs = _word_offsets(task.bd, task.repeat_count)
            if offs.numel() == 0:
                return
            lo = task.offset + int(offs.min()) * 4
            hi = task.offset + int(offs.max()) * 4 + 4
        size = self.host[task.arg_idx].numel()
        if task.offset % 4:
            raise AddressFault(f"xdna txn: op {task.op_index} (BD {task.bd_id}, column {task.column}): base "
                               f"address offset {task.offset} is not 4-byte aligned (field base_address_low)")
        if lo < 0 or hi > size:
            bd = task.bd
            raise AddressFault(
                f"xdna txn: op {task.op_index} (task-queue push of BD {task.bd_id}, column {task.column} "
                f"{task.direction} channel {task.channel}): the access pattern reaches bytes [{lo}, {hi}) of "
                f"host buffer {task.arg_idx}, which holds {size} bytes (fields: offset={task.offset}, "
                f"buffer_length={bd.buffer_length}, d0 {bd.d0_size}/{bd.d0_stride}, d1 {bd.d1_size}/"
                f"{bd.d1_stride}, d2_stride={bd.d2_stride}, iteration {bd.iteration_size}/"
                f"{bd.iteration_stride}, repeat_count={task.repeat_count})")

    def _sync(self, k: int, op: T.Sync) -> None:
        self.counts["syncs"] += 1
        direction = "S2MM" if op.direction == T.DIRECTION_CODE["S2MM"] else "MM2S"
        keys = [(c, direction, op.channel) for c in range(op.column, op.column + max(1, op.column_num))]
        while True:
            if all(self.tokens.get(key, 0) > 0 for key in keys):
                for key in keys:
                    self.tokens[key] -= 1
                still = []
                for t in self.open:           # the host saw completion: finished BDs may be reused
                    if t.done:
                        t.freed = True
                        if (t.column, t.direction, t.channel) in keys:
                            t.synced = True   # its own channel's token: its data has landed
                    if not (t.freed and (t.synced or t.direction != "S2MM")):
                        still.append(t)
                self.open = still             # (tasks freed and, for S2MM, synced: settled)
                return
            if not self._step():
                self._diagnose(k, op, keys)

    def _finish(self, n_ops: int) -> None:
        self._quiesce()
        pending = [t for t in self.tasks if t.direction == "S2MM" and not t.synced]
        if pending:
            t = pending[0]
            state = "finished, but" if t.done else "unfinished and"
            raise MissingSync(
                f"xdna txn: the stream ends (after op {n_ops - 1}) with the S2MM task of BD {t.bd_id} on "
                f"column {t.column} channel {t.channel} (pushed by op {t.op_index}) {state} never awaited "
                f"by a sync: the host would read its output before it lands; add a sync for it")

    # --- scheduling ---------------------------------------------------------------------------
    def _step(self) -> bool:
        progress = False
        for f in self.fifos.values():
            progress |= f.move()
        for chan, q in self.queues.items():
            progress |= self._run_channel(chan, q)
        for ln in self.links:
            progress |= ln.step()
        for c in self.cores:
            progress |= c.step()
        return progress

    def _quiesce(self) -> None:
        for _ in itertools.count():
            if not self._step():
                return

    def _run_channel(self, chan, q: deque) -> bool:
        """Advance one shim channel: MM2S turns queued tasks into stream bytes and emits whole
        FIFO elements (tasks may share an element); S2MM takes elements and completes the head
        task once its bytes have arrived."""
        progress = False
        fifo = self.fifos[self.chan_fifo[chan]]
        dtype = fifo.f.elem.dtype
        carry = self.carry.setdefault(chan, _Carry())
        if chan[1] == "MM2S":
            for t in q:
                if t.stream is None:
                    t.stream = self._mm2s_stream(t, dtype)
                    carry.put(t.stream)
                    t.pos = carry.total_in         # the task is done once the stream passed this byte
                    progress = True
            while carry.n >= fifo.nbytes and fifo.can_produce():
                fifo.push(carry.take(fifo.nbytes))
                progress = True
            # bytes of a partly filled element already sit in the consumer's free buffer (its
            # DMA writes as they arrive; the lock is released once the element is whole)
            absorbed = carry.total_out + (carry.n if carry.n < fifo.nbytes and fifo.can_produce() else 0)
            while q and q[0].pos <= absorbed:
                self._complete(q.popleft())
                progress = True
            return progress
        ci = self.chan_ci.get(chan)
        if ci is None:
            ci = self.chan_ci[chan] = fifo.consumer_index(self.p.tile(chan[0], 0))
        queue = fifo.queues[ci]
        while q:
            t = q[0]
            need = self._s2mm_need(t, dtype)
            while carry.n < need and queue:
                carry.put(queue.popleft())
                progress = True
            if carry.n < need:
                t.taken_bytes = carry.n
                return progress
            self._s2mm_write(t, carry.take(need), dtype)
            self._complete(t)
            q.popleft()
            progress = True
        return progress

    def _complete(self, t: _Task) -> None:
        t.done = True
        if t.token:
            key = (t.column, t.direction, t.channel)
            self.tokens[key] = self.tokens.get(key, 0) + 1

    def _mm2s_stream(self, t: _Task, dtype: str) -> torch.Tensor:
        if t.bd_id < 0:                       # all-padding task: zeros in its argument's units
            return torch.zeros(int(t.ir_task.stream_elements * elem_bytes(self._arg_dtype(t.ir_task))),
                               dtype=torch.uint8)
        data = _read_bd(self.host[t.arg_idx], t)
        self.counts["mm2s_bytes"] += data.numel()
        if t.ir_task is not None:
            pm = pad_map(t.ir_task)
            if pm is not None:
                data = _apply_pads(data, pm, self._arg_dtype(t.ir_task), t.ir_task.repeat)
        return data

    def _s2mm_need(self, t: _Task, dtype: str) -> int:
        if t.ir_task is not None:
            return int(t.ir_task.stream_elements * elem_bytes(self._arg_dtype(t.ir_task)))
        return t.bd.buffer_length * 4 * (t.repeat_count + 1)

    def _s2mm_write(self, t: _Task, stream: torch.Tensor, dtype: str) -> None:
        if t.bd_id < 0:
            return
        if t.ir_task is not None:
            pm = pad_map(t.ir_task)
            if pm is not None:
                stream = _drop_pads(stream, pm, self._arg_dtype(t.ir_task), t.ir_task.repeat)
        _write_bd(self.host[t.arg_idx], t, stream)
        self.counts["s2mm_bytes"] += stream.numel()

    # --- diagnosis ------------------------------------------------------------------------------
    def _diagnose(self, k: int, op: T.Sync, keys) -> None:
        waits = [c.waiting for c in self.cores if c.waiting] + [ln.waiting for ln in self.links if ln.waiting]
        cycle = self._lock_cycle()
        if cycle:
            raise LockDeadlock(f"xdna txn: op {k} (sync): lock deadlock: " + "; ".join(cycle)
                               + ". Each waits for a lock the next holds: check acquire/release counts "
                               "and FIFO depths")
        key = keys[0]
        q = self.queues.get(key)
        why = []
        if not q or all(t.done for t in q):
            why.append(f"no unfinished task is queued on column {key[0]} {key[1]} channel {key[2]} "
                       f"(the stream never pushed one, or it issued no token)")
        for (c, d, ch), qq in self.queues.items():
            for t in qq:
                if not t.done and t.direction == "S2MM":
                    why.append(f"S2MM BD {t.bd_id} (column {c} channel {ch}) received {t.taken_bytes} of "
                               f"{self._s2mm_need(t, '')} bytes")
        why += waits[:4]
        raise SyncTimeout(
            f"xdna txn: op {k} (sync on column {op.column} {key[1]} channel {op.channel}) never completes: "
            f"the driver reports ERT_CMD_STATE_TIMEOUT after {self.timeout_ms} ms. Stalled because: "
            + "; ".join(why or ["no process can make progress"]))

    def _lock_cycle(self) -> list[str]:
        """A cycle of cores each blocked on a FIFO whose other side is another blocked core."""
        by_tile = {c.tile: c for c in self.cores}
        edges: dict[ir.Tile, tuple[ir.Tile, str]] = {}
        for c in self.cores:
            if not c.blocked:
                continue
            fifo, port = c.blocked
            f = self.fifos[fifo].f
            others = [f.producer] if port == "consume" else list(f.consumers)
            for o in others:
                if o in by_tile and by_tile[o].blocked:
                    edges[c.tile] = (o, f"{c.tile.name} waits to {port.replace('consume', 'acquire from')} "
                                        f"{fifo!r} ({'full' if port == 'produce' else 'empty'})")
                    break
        for start in edges:
            seen, node, path = set(), start, []
            while node in edges and node not in seen:
                seen.add(node)
                nxt, why = edges[node]
                path.append(why)
                node = nxt
            if node == start:
                return path
        return []


class _Carry:
    """Bytes in flight on one shim channel's stream, not yet a whole element / task."""

    def __init__(self):
        self.parts: deque = deque()
        self.n = 0
        self.total_in = 0
        self.total_out = 0

    def put(self, x: torch.Tensor) -> None:
        if x.numel():
            self.parts.append(x)
            self.n += x.numel()
            self.total_in += x.numel()

    def take(self, n: int) -> torch.Tensor:
        out, got = [], 0
        while got < n:
            x = self.parts.popleft()
            if got + x.numel() > n:
                k = n - got
                out.append(x[:k])
                self.parts.appendleft(x[k:])
                got = n
            else:
                out.append(x)
                got += x.numel()
        self.n -= n
        self.total_out += n
        return out[0] if len(out) == 1 else torch.cat(out)


def _data_elems(t: ir.DmaTask) -> int:
    return t.elements


def _data_bytes(t: ir.DmaTask, dtype: str) -> int:
    return int(t.elements * elem_bytes(dtype))


def _word_offsets(bd: T.ShimBD, repeat_count: int) -> torch.Tensor:
    """Word offsets one task touches, in stream order (torch version of txn.bd_word_offsets)."""
    L = bd.buffer_length
    if L == 0:
        return torch.zeros(0, dtype=torch.long)
    i = torch.arange(L)
    if bd.d0_size == 0 and bd.d1_size == 0:
        base = i
    else:
        d0, d1 = max(bd.d0_size, 1), max(bd.d1_size, 1)
        base = (i % d0) * (bd.d0_stride + 1) + ((i // d0) % d1) * (bd.d1_stride + 1) \
            + (i // (d0 * d1)) * (bd.d2_stride + 1)
    if repeat_count == 0 and bd.iteration_current == 0:
        return base
    wrap = bd.iteration_size + 1
    step = bd.iteration_stride + 1 if bd.iteration_size else 0
    it = (torch.arange(repeat_count + 1) + bd.iteration_current) % wrap
    return (it.unsqueeze(-1) * step + base).reshape(-1)


_BOX: dict = {}


def _bd_box(bd: T.ShimBD, repeat_count: int):
    """The words _word_offsets enumerates as a strided box: (base word, ((size, stride), ...)
    outermost first), or None when the pattern is not one (a partial d2 run, iterations that
    wrap). Cached per BD and repeat count."""
    key = (bd, repeat_count)
    hit = _BOX.get(key, False)
    if hit is not False:
        return hit
    box = None
    L = bd.buffer_length
    if L:
        if bd.d0_size == 0 and bd.d1_size == 0:
            inner = ((L, 1),)
        else:
            d0, d1 = max(bd.d0_size, 1), max(bd.d1_size, 1)
            inner = ((L // (d0 * d1), bd.d2_stride + 1), (d1, bd.d1_stride + 1),
                     (d0, bd.d0_stride + 1)) if L % (d0 * d1) == 0 else None
        if inner is not None:
            wrap = bd.iteration_size + 1
            step = bd.iteration_stride + 1 if bd.iteration_size else 0
            if repeat_count == 0:
                box = ((bd.iteration_current % wrap) * step, inner)
            elif step == 0:
                box = (0, ((repeat_count + 1, 0),) + inner)
            elif bd.iteration_current + repeat_count < wrap:
                box = (bd.iteration_current * step, ((repeat_count + 1, step),) + inner)
    if len(_BOX) > 8192:
        _BOX.clear()
    _BOX[key] = box
    return box


def _bd_view(buf: torch.Tensor, t: _Task):
    """The task's bytes of host buffer `buf` as a strided view (sizes..., 4), or None."""
    box = _bd_box(t.bd, t.repeat_count)
    if box is None or buf.dim() != 1 or not buf.is_contiguous():
        return None
    base, dims = box
    sizes = tuple(n for n, _ in dims) + (4,)
    strides = tuple(4 * st for _, st in dims) + (1,)
    return buf.as_strided(sizes, strides, buf.storage_offset() + t.offset + 4 * base)


def _read_bd(buf: torch.Tensor, t: _Task) -> torch.Tensor:
    """MM2S: the bytes one pushed BD reads, in stream order (a copy)."""
    v = _bd_view(buf, t)
    if v is None:
        return buf[_byte_offsets(t)]
    out = torch.empty(v.shape, dtype=buf.dtype)
    out.copy_(v)
    return out.reshape(-1)


def _write_bd(buf: torch.Tensor, t: _Task, stream: torch.Tensor) -> None:
    """S2MM: write the stream bytes where the BD's pattern says (index writes when a stride-0
    dimension would write one word several times)."""
    v = _bd_view(buf, t)
    if v is None or any(st == 0 and n > 1 for n, st in zip(v.shape, v.stride())):
        buf[_byte_offsets(t)] = stream
        return
    v.copy_(stream.view(v.shape))


def _byte_offsets(t: _Task) -> torch.Tensor:
    w = _word_offsets(t.bd, t.repeat_count)
    return (w.unsqueeze(-1) * 4 + t.offset + torch.arange(4)).reshape(-1)


_PAD_IDX: dict = {}


def _pad_index(pm: torch.Tensor, b: int, repeat: int, n_data: int, drop: bool) -> torch.Tensor:
    """Byte gather index of a padded stream (from the data bytes and one zero element at the
    end) or, drop=True, of the data bytes within a padded stream; cached per pad map."""
    key = (pm.data_ptr(), pm.numel(), b, repeat, n_data, drop)
    hit = _PAD_IDX.get(key)
    if hit is not None and hit[0] is pm:
        return hit[1]
    if drop:
        full = pm.repeat(repeat) if repeat > 1 else pm
        idx = _byte_index(torch.nonzero(full >= 0).reshape(-1), b)
    else:
        per = int((pm >= 0).sum())
        full = torch.cat([torch.where(pm >= 0, pm + r * per, pm) for r in range(repeat)]) \
            if repeat > 1 else pm
        idx = _byte_index(torch.where(full >= 0, full, torch.full_like(full, n_data)), b)
    if len(_PAD_IDX) > 8192:
        _PAD_IDX.clear()
    _PAD_IDX[key] = (pm, idx)            # pm kept alive: its address cannot be reused
    return idx


def _apply_pads(data: torch.Tensor, pm: torch.Tensor, dtype: str, repeat: int) -> torch.Tensor:
    b = elem_bytes(dtype)
    if b < 1:
        raise PatternFault(f"zero padding of sub-byte ({dtype}) elements is not supported by the DMA")
    b = int(b)
    src = torch.cat([data, torch.zeros(b, dtype=torch.uint8)])
    return src[_pad_index(pm, b, repeat, data.numel() // b, False)]


def _drop_pads(stream: torch.Tensor, pm: torch.Tensor, dtype: str, repeat: int) -> torch.Tensor:
    b = int(elem_bytes(dtype))
    return stream[_pad_index(pm, b, repeat, 0, True)]


# --- mem-tile links --------------------------------------------------------------------------------
class _Link:
    """A mem-tile forward / split / join: consumes one element of each source, produces one of
    each destination, with the destinations' dims-to-stream applied to the mem-tile buffer."""

    def __init__(self, ex: TxnExecutor, ln: ir.FifoLink):
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
                    d.push(gather(buf, d.f.dims_to_stream, d.f.elem.numel, d.f.elem.dtype, off).clone())
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
    def _layout(s: _FifoState, ci: int, stream: torch.Tensor) -> torch.Tensor:
        dims = s.f.dims_from_stream[ci] if s.f.dims_from_stream else ()
        if not dims:
            return stream
        buf = torch.zeros(s.nbytes, dtype=torch.uint8)
        scatter(buf, stream, dims, s.f.elem.numel, s.f.elem.dtype)
        return buf


# --- cores -----------------------------------------------------------------------------------------
class _Core:
    """A compute core running its program: a generator that yields whenever it blocks."""

    def __init__(self, ex: TxnExecutor, body: ir.CoreBody):
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
                counter = itertools.count() if op.count is None else range(op.count)
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
                args.append(_typed(held[a.index], fs.f.elem))
            elif isinstance(a, ir.BufferRef):
                ty = self.ex.buffer_types.get(a.name)
                if ty is None:
                    ty = self.ex.p.buffer(a.name).type          # raises, naming the buffer
                args.append(_typed(self.ex.buffers[a.name], ty))
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
        return _typed(self.ex.buffers[name], b.type).reshape(-1)[0].item()


def _typed(buf: torch.Tensor, t: ir.TensorType) -> torch.Tensor:
    dt = TORCH_DTYPE[t.dtype]
    if t.dtype == "i4":
        return buf                       # packed nibbles: the kernel unpacks
    return buf.view(dt).reshape(t.shape)


# --- entry point ---------------------------------------------------------------------------------
def execute(program: ir.ArrayProgram, words: Sequence[int], host: Sequence[torch.Tensor],
            scalars: dict | None = None, **kw) -> dict:
    """Run one launch's stream against its host buffers (flat uint8 or typed tensors, in the
    runtime sequence's argument order). Returns counts (BD writes, patches, bytes, calls)."""
    # a launch is thousands of tile-sized kernel calls: intra-op threads only add overhead
    threads = torch.get_num_threads()
    if threads != 1:
        torch.set_num_threads(1)
    try:
        return TxnExecutor(program, words, host, scalars, **kw).run()
    finally:
        if threads != 1:
            torch.set_num_threads(threads)


__all__ = ["execute", "TxnExecutor", "TxnFault", "BdBusy", "BdExhausted", "TaskQueueOverflow",
           "AddressFault", "PatternFault", "SyncTimeout", "LockDeadlock", "MissingSync"]
