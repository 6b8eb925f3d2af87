"""Builder for ArrayPrograms: placement helpers, fifo channel assignment, and a runtime-sequence
writer that keeps every shim inside its task-queue depth and BD count.

Sequence discipline (why designs cannot deadlock): a lowering issues its work in rounds; in a
round the S2MM tasks that drain the round's outputs are queued first, then the MM2S tasks that
feed it. When a channel's queue is full or the shim has no free BD, the writer awaits that
channel's oldest task, which always completes because its consumers can drain into the already
queued outputs. `end_round()` awaits everything still in flight. Every task issues a token.
"""
from __future__ import annotations

from collections import defaultdict, deque

import torch

from torch_xdna.array import ir
from torch_xdna.array.bd import split_wide_innermost
from torch_xdna.hw import Generation
from torch_xdna.hw.aie2p_regs import SHIM_BDS as _SHIM_BDS

TORCH_TO_IR = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16",
               torch.int8: "i8", torch.uint8: "u8", torch.bool: "u8", torch.int16: "i16",
               torch.int32: "i32", torch.int64: "i64"}
SHIM_BDS = _SHIM_BDS.value          # shim BDs per column (hw/aie2p_regs.py, with its source)


class LoweringError(ValueError):
    """A design cannot be expressed as an ArrayProgram: names the design and the reason."""


def ir_dtype(dt) -> str:
    if isinstance(dt, str):
        return dt if dt in ir.DTYPE_BITS else TORCH_TO_IR[getattr(torch, dt)]
    return TORCH_TO_IR[dt]


def tt(shape, dtype) -> ir.TensorType:
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    return ir.TensorType(shape or (1,), ir_dtype(dtype))


class Builder:
    def __init__(self, name: str, gen: Generation):
        self.name, self.gen = name, gen
        self.tiles: dict[tuple[int, int], ir.Tile] = {}
        self.fifos: list[ir.ObjectFifo] = []
        self.links: list[ir.FifoLink] = []
        self.buffers: list[ir.TileBuffer] = []
        self.kernels: dict[str, ir.KernelDecl] = {}
        self.cores: list[ir.CoreBody] = []
        self.args: list[ir.HostArg] = []
        self.scalars: list[ir.ScalarArg] = []
        self.ops: list = []
        self.notes: dict[str, object] = {}
        self._chan: dict[str, tuple[int, str, int]] = {}          # shim fifo -> (col, dir, ch)
        self._next_ch: dict[tuple[int, str], int] = defaultdict(int)
        self._queue: dict[tuple[int, str, int], deque] = defaultdict(deque)
        self._free_bds: dict[int, list[int]] = {}
        self._task_bd: dict[int, tuple[int, int, tuple]] = {}
        self._next_task = 0

    # -- placement -------------------------------------------------------------------------
    def _tile(self, col: int, row: int, kind: str) -> ir.Tile:
        if not 0 <= col < self.gen.columns.value:
            raise LoweringError(f"{self.name}: column {col} outside the array's "
                                f"{self.gen.columns.value} columns")
        t = self.tiles.setdefault((col, row), ir.Tile(col, row, kind))
        return t

    def shim(self, col: int) -> ir.Tile:
        return self._tile(col, 0, "shim")

    def mem(self, col: int) -> ir.Tile:
        return self._tile(col, 1, "mem")

    def core(self, col: int, row: int) -> ir.Tile:
        """Compute tile `row` (0-based) of a column: array row 2 + row."""
        if not 0 <= row < self.gen.core_rows.value:
            raise LoweringError(f"{self.name}: core row {row} outside the array's "
                                f"{self.gen.core_rows.value} core rows")
        return self._tile(col, 2 + row, "compute")

    # -- static configuration --------------------------------------------------------------
    def fifo(self, name: str, producer: ir.Tile, consumers, depth: int, elem: ir.TensorType,
             dims=(), dims_from=(), pad_dims=()) -> ir.ObjectFifo:
        """`pad_dims` ((before, after) per dim of `dims`): zeros the mem-tile producer's MM2S
        adds around its walk (mlir-aie padDimensions); the element is the padded walk."""
        consumers = tuple(consumers) if isinstance(consumers, (list, tuple)) else (consumers,)
        bits, wrap = ir.DTYPE_BITS[elem.dtype], self.gen.dma_wrap_bits.value
        split = split_wide_innermost(tuple(dims), bits, (1 << wrap[producer.kind]) - 1)
        if pad_dims and split != tuple(dims):
            raise LoweringError(f"{self.name}: fifo {name}: a padded walk's innermost run is wider "
                                f"than the BD's size field")
        dims = split
        dims_from = tuple(split_wide_innermost(tuple(d), bits, (1 << wrap[c.kind]) - 1)
                          for d, c in zip(dims_from, consumers))
        f = ir.ObjectFifo(name, producer, consumers, depth, elem, tuple(dims), tuple(dims_from),
                          tuple(tuple(p) for p in pad_dims))
        self.fifos.append(f)
        for end, direction in ((producer, "MM2S"),) + tuple((c, "S2MM") for c in consumers):
            if end.kind == "shim":
                key = (end.col, direction)
                self._chan[name] = (end.col, direction, self._next_ch[key])
                self._next_ch[key] += 1
        return f

    def link(self, srcs, dsts, src_offsets=(), dst_offsets=(), emits: int = 1) -> None:
        self.links.append(ir.FifoLink(tuple(srcs), tuple(dsts), tuple(src_offsets), tuple(dst_offsets),
                                      emits))

    def buffer(self, name: str, tile: ir.Tile, type_: ir.TensorType, rtp: bool = False) -> str:
        self.buffers.append(ir.TileBuffer(name, tile, type_, "L2" if tile.kind == "mem" else "L1", rtp))
        return name

    def kernel(self, symbol: str, arg_types, object_file: str | None = None) -> str:
        if symbol not in self.kernels:
            self.kernels[symbol] = ir.KernelDecl(symbol, object_file or f"{symbol}.o", tuple(arg_types))
        return symbol

    def core_body(self, tile: ir.Tile, body, link_with=()) -> None:
        objs = tuple(dict.fromkeys(link_with or (self.kernels[s].object_file for s in _calls(body))))
        self.cores.append(ir.CoreBody(tile, tuple(body), objs))

    def arg(self, name: str, shape, dtype) -> str:
        n = 1
        for s in (shape if isinstance(shape, (tuple, list)) else (shape,)):
            n *= int(s)
        self.args.append(ir.HostArg(name, tt((max(1, n),), dtype)))
        return name

    def scalar(self, name: str, dtype: str = "i32") -> ir.ScalarRef:
        self.scalars.append(ir.ScalarArg(name, dtype))
        return ir.ScalarRef(name)

    # -- runtime sequence ------------------------------------------------------------------
    def task(self, fifo: str, arg: str, offset: int, sizes, strides, pad_after=()) -> int:
        """Queue one shim BD on the channel of `fifo`; awaits the channel's oldest task first
        when its queue or the shim's BDs are full. An outer dimension whose stride is beyond
        the DMA's limit is unrolled into one task per step (same stream)."""
        limit = self.gen.max_dma_stride.value
        sizes, strides = tuple(int(x) for x in sizes), tuple(int(x) for x in strides)
        if len(sizes) > 1 and sizes[-1] > 0 and strides[-1] == 1 and not self._legal(arg, sizes, strides):
            refit = _refactor_inner(sizes, strides, pad_after, self._bits(arg))
            if refit is not None and self._legal(arg, refit[0], refit[1]):
                sizes, strides, pad_after = refit
        if len(sizes) > 1 and sizes[0] > 1 and (
                strides[0] > limit or not self._legal(arg, sizes, strides)):
            pads = tuple(pad_after) or (0,) * len(sizes)
            tid = -1
            for i in range(int(sizes[0])):
                tid = self.task(fifo, arg, offset + i * strides[0], sizes[1:], strides[1:], pads[1:])
            if pads[0]:
                inner = 1
                for sz, pd in zip(reversed(sizes[1:]), reversed(pads[1:])):
                    inner = inner * sz + pd * inner
                tid = self.task(fifo, arg, 0, (0,), (1,), (pads[0] * inner,))
            return tid
        if fifo not in self._chan:
            raise LoweringError(f"{self.name}: fifo {fifo!r} has no shim endpoint")
        col, direction, ch = self._chan[fifo]
        key = (col, direction, ch)
        depth = self.gen.shim_task_queue_depth.value
        free = self._free_bds.setdefault(col, list(range(SHIM_BDS)))
        while len(self._queue[key]) >= depth or not free:
            victim_key = key if self._queue[key] else self._oldest_on(col)
            self._await((self._queue[victim_key][0],))
        self._check_words(fifo, arg, offset, sizes, strides)
        bd = free.pop(0)
        tid = self._next_task
        self._next_task += 1
        sizes, strides = tuple(int(s) for s in sizes), tuple(int(s) for s in strides)
        pads = tuple(int(p) for p in pad_after)
        if pads and not any(pads):
            pads = ()
        self.ops.append(ir.DmaTask(tid, fifo, arg, int(offset), sizes, strides, direction, ch, col,
                                   bd, issue_token=True, pad_after=pads))
        self._queue[key].append(tid)
        self._task_bd[tid] = (col, bd, key)
        return tid

    def _check_words(self, fifo, arg, offset, sizes, strides) -> None:
        """The shim DMA addresses 32-bit words: base, runs and strides must be whole words."""
        bits = self._bits(arg)
        if not all(int(x) for x in sizes):
            return
        bad = None
        if int(offset) * bits % 32:
            bad = f"offset {offset}"
        elif int(sizes[-1]) * bits % 32:
            bad = f"run of {sizes[-1]} elements"
        else:
            for sz, st in zip(sizes[:-1], strides[:-1]):
                if int(sz) > 1 and int(st) * bits % 32:
                    bad = f"stride {st}"
                    break
        if bad:
            raise LoweringError(
                f"{self.name}: task on {arg!r} ({fifo}): {bad} is not a whole number of 32-bit "
                f"words ({bits}-bit elements); the shim DMA addresses words, so this operand's "
                f"rows must be a multiple of {32 // bits} elements (pad them on the host)")

    def _bits(self, arg: str) -> int:
        for a in self.args:
            if a.name == arg:
                return ir.DTYPE_BITS[a.type.dtype]
        raise LoweringError(f"{self.name}: task on unknown host arg {arg!r}")

    def _legal(self, arg: str, sizes, strides) -> bool:
        """Whether the shim BD fields can hold this pattern (the stream encoder's own check)."""
        if not all(sizes):
            return True
        try:
            from torch_xdna.array import txn
        except ImportError:
            return True
        try:
            txn.hw_pattern(sizes, strides, self._bits(arg))
        except txn.StreamError:
            return False
        return True

    def _oldest_on(self, col: int) -> tuple:
        keys = [k for k, q in self._queue.items() if k[0] == col and q]
        return min(keys, key=lambda k: self._queue[k][0])

    def _await(self, tids) -> None:
        self.ops.append(ir.Await(tuple(tids)))
        for t in tids:
            col, bd, key = self._task_bd.pop(t)
            self._queue[key].remove(t)
            self._free_bds[col].append(bd)
            self._free_bds[col].sort()

    def end_round(self) -> None:
        pending = sorted(self._task_bd)
        if pending:
            self._await(pending)

    def _name_objects(self) -> None:
        """Object files named per kernel source and tile defines (kernels/aie.object_files):
        symbols of one source share one object, so a core never links a symbol twice."""
        from torch_xdna.kernels.aie import KernelContractError, object_files
        try:
            objs = object_files(self.kernels.values(), self.notes.get("chain"))
        except KernelContractError as e:
            raise LoweringError(f"{self.name}: {e}") from None
        old = {}
        for sym, k in list(self.kernels.items()):
            if k.object_file == f"{sym}.o":            # not set explicitly by the lowering
                old[k.object_file] = objs[sym][0]
                self.kernels[sym] = ir.KernelDecl(sym, objs[sym][0], k.arg_types)
        self.cores = [ir.CoreBody(c.tile, c.body, _rename_objects(c.link_with, old))
                      for c in self.cores]

    def rtp(self, buffer: str, index: int, value) -> None:
        self.ops.append(ir.RtpWrite(buffer, index, value))

    def build(self) -> ir.ArrayProgram:
        self.end_round()
        self._name_objects()
        return ir.ArrayProgram(
            name=self.name, generation=self.gen.name,
            tiles=tuple(sorted(self.tiles.values(), key=lambda t: (t.col, t.row))),
            fifos=tuple(self.fifos), links=tuple(self.links), buffers=tuple(self.buffers),
            kernels=tuple(self.kernels.values()), cores=tuple(self.cores),
            sequence=ir.RuntimeSequence(tuple(self.args), tuple(self.ops), tuple(self.scalars)),
            notes=tuple(sorted((k, v) for k, v in self.notes.items())))


def _rename_objects(objs, names):
    return tuple(dict.fromkeys(names.get(o, o) for o in objs))


def _refactor_inner(sizes, strides, pads, bits: int):
    """Split a contiguous innermost run too long for the BD's wrap field into (n/a, a)."""
    n = sizes[-1]
    pads = tuple(pads) or (0,) * len(sizes)
    if len(sizes) >= 4:
        return None
    from torch_xdna.hw import aie2p_regs
    wrap = (1 << aie2p_regs.SHIM_WRAP_BITS.value) - 1            # words
    for a in range(min(n, wrap * 32 // bits), 0, -1):
        if n % a == 0 and a * bits % 32 == 0 and pads[-1] % a == 0:
            return (sizes[:-1] + (n // a, a), strides[:-1] + (a, 1),
                    pads[:-1] + (pads[-1] // a, 0))
    return None


def _calls(body):
    for op in body:
        if isinstance(op, ir.Call):
            yield op.kernel
        elif isinstance(op, ir.Loop):
            yield from _calls(op.body)


def forever(*body) -> ir.Loop:
    return ir.Loop(ir.FOREVER, tuple(body))


def loop(count, *body):
    """A counted loop; a count of 1 is flattened (no scf.for for one trip). A ScalarRef count
    (an RTP buffer) is a runtime trip count (ir.Loop)."""
    if isinstance(count, ir.ScalarRef):
        return (ir.Loop(count, tuple(body)),)
    if count == 1:
        return body
    return (ir.Loop(int(count), tuple(body)),)


def flat(*parts) -> tuple:
    out = []
    for p in parts:
        if isinstance(p, (list, tuple)):
            out.extend(flat(*p))
        else:
            out.append(p)
    return tuple(out)


def acq(fifo, port="consume", n=1):
    return ir.Acquire(fifo, port, n)


def rel(fifo, port="consume", n=1):
    return ir.Release(fifo, port, n)


def call(kernel, *args):
    return ir.Call(kernel, tuple(args))


def elem(fifo, i=0):
    return ir.FifoElem(fifo, i)


def spread(n: int, parts: int) -> list[int]:
    """n items over `parts` bins, the first bins one larger."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
