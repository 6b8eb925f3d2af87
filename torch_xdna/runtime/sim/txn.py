"""The transaction level of the `sim` backend: execute a launch's instruction stream.

The functional level runs a design's whole-tensor reference. This level runs what the NPU would:
it decodes the launch's stream (array/txn.py), keeps each shim column's BD registers, applies DDR
patches, and on task-queue pushes executes the BDs against the launch's host buffers (strided
word reads/writes exactly as the BD fields say). Data moves through the design's object FIFOs
(depth-bounded, broadcast to every consumer, dims-to/from-stream transforms), mem-tile
forward/split/join links, and each core's program (loops, acquire/release, kernel calls) runs the
registered core-kernel references (core_kernels.py) on its tile buffers. Syncs wait for tokens.
What the chip or driver would reject becomes a named fault (txn_faults.py). The stream data
(patterns, pads, BD addressing) is in txn_streams.py, the FIFOs, links and cores in txn_fabric.py;
this module decodes the stream and schedules them.

Scheduling is cooperative and deterministic: processes (shim channels, links, cores) run until
none can progress; a sync returns when its token arrives, else the stall is diagnosed.
"""
from __future__ import annotations

import itertools
import struct
from collections import deque
from typing import Sequence

import torch

from torch_xdna.array import ir
from torch_xdna.array import txn as T
from torch_xdna.hw import aie2p_regs as R
from torch_xdna.runtime.sim import core_kernels
from torch_xdna.runtime.sim.txn_fabric import CoreProcess, FifoState, MemTileLink
from torch_xdna.runtime.sim.txn_faults import (AddressFault, BdBusy, BdExhausted, LockDeadlock,
                                               MissingSync, PatternFault, SyncTimeout,
                                               TaskQueueOverflow, TxnFault)
from torch_xdna.runtime.sim.txn_streams import (QUEUE_DEPTH, ShimTask, StreamCarry, apply_pads,
                                                bd_box, drop_pads, elem_bytes, pad_map, read_bd,
                                                task_data_bytes, task_data_elems, word_offsets,
                                                write_bd)


class TxnExecutor:
    """Runs one launch: `program` (the design's IR), its stream words, its host buffers.

    design_tasks: the simulator's stream was encoded from `program`'s own runtime sequence, so
    each pushed BD is checked against the IR task it encodes (and the IR's all-padding tasks are
    replayed). The emulated NPU passes False: like the chip, it knows only the static
    configuration and runs whatever stream it is given (a per-launch stream need not be the
    example sequence its artifact was built with); the channel of each FIFO still comes from
    the configuration."""

    def __init__(self, program: ir.ArrayProgram, words: Sequence[int], host: Sequence[torch.Tensor],
                 scalars: dict | None = None, queue_depth: int = QUEUE_DEPTH, timeout_ms: int = 2000,
                 fold_ddr_offset: bool = True, kernels: core_kernels.KernelRegistry | None = None,
                 design_tasks: bool = True):
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
        self.fifos = {f.name: FifoState(f) for f in program.fifos}
        self.bds: dict[tuple[int, int], list[int]] = {}
        self.patched: dict[tuple[int, int], tuple[int, int]] = {}
        self.busy: dict[tuple[int, int], ShimTask] = {}
        self.queues: dict[tuple[int, str, int], deque[ShimTask]] = {}
        self.tokens: dict[tuple[int, str, int], int] = {}
        self.tasks: list[ShimTask] = []
        self.open: list[ShimTask] = []       # tasks not yet freed (or, S2MM, not yet synced)
        self.carry: dict[tuple[int, str, int], StreamCarry] = {}
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
            if design_tasks:
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
        self.cores = [CoreProcess(self, c) for c in program.cores]
        self.links = [MemTileLink(self, ln) for ln in program.links]

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
        task = ShimTask(k, p.column, p.direction, p.channel, p.bd_id, bd, arg_idx, offset, p.repeat_count,
                     p.issue_token, ir_task)
        self._check_bounds(task)
        if ir_task is not None:
            data_bytes = bd.buffer_length * 4 * (p.repeat_count + 1)
            want = task_data_bytes(ir_task, self._arg_dtype(ir_task))
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
        while q and task_data_elems(q[0]) == 0:
            pad = q.popleft()
            self.queues.setdefault(chan, deque()).append(ShimTask(
                self.op_index, chan[0], chan[1], chan[2], -1, T.ShimBD(0), 0, 0, 0, False, pad))

    def _arg_dtype(self, t: ir.DmaTask) -> str:
        for a in self.p.sequence.args:
            if a.name == t.arg:
                return a.type.dtype
        raise PatternFault(f"dma task {t.id}: unknown argument {t.arg!r}")

    def _check_bounds(self, task: ShimTask) -> None:
        box = bd_box(task.bd, task.repeat_count)
        if box is not None:
            base, dims = box
            lo = task.offset + base * 4
            hi = lo + (sum((n - 1) * st for n, st in dims) + 1) * 4
        else:
            offs = word_offsets(task.bd, task.repeat_count)
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
        carry = self.carry.setdefault(chan, StreamCarry())
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

    def _complete(self, t: ShimTask) -> None:
        t.done = True
        if t.token:
            key = (t.column, t.direction, t.channel)
            self.tokens[key] = self.tokens.get(key, 0) + 1

    def _mm2s_stream(self, t: ShimTask, dtype: str) -> torch.Tensor:
        if t.bd_id < 0:                       # all-padding task: zeros in its argument's units
            return torch.zeros(int(t.ir_task.stream_elements * elem_bytes(self._arg_dtype(t.ir_task))),
                               dtype=torch.uint8)
        data = read_bd(self.host[t.arg_idx], t)
        self.counts["mm2s_bytes"] += data.numel()
        if t.ir_task is not None:
            pm = pad_map(t.ir_task)
            if pm is not None:
                data = apply_pads(data, pm, self._arg_dtype(t.ir_task), t.ir_task.repeat)
        return data

    def _s2mm_need(self, t: ShimTask, dtype: str) -> int:
        if t.ir_task is not None:
            return int(t.ir_task.stream_elements * elem_bytes(self._arg_dtype(t.ir_task)))
        return t.bd.buffer_length * 4 * (t.repeat_count + 1)

    def _s2mm_write(self, t: ShimTask, stream: torch.Tensor, dtype: str) -> None:
        if t.bd_id < 0:
            return
        if t.ir_task is not None:
            pm = pad_map(t.ir_task)
            if pm is not None:
                stream = drop_pads(stream, pm, self._arg_dtype(t.ir_task), t.ir_task.repeat)
        write_bd(self.host[t.arg_idx], t, stream)
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
