"""Stream data of the transaction level: what the DMAs move and how they address it.

Object FIFO element patterns (dims-to/from-stream gathers and scatters, cached index tensors),
zero padding (pad maps), and the shim side: one pushed BD execution (ShimTask), the bytes in
flight on a channel (StreamCarry), and a BD's word addressing of its host buffer (strided views
where the pattern is a box, index reads/writes where it is not). Used by txn.py (the executor) and
txn_fabric.py (FIFOs, links, cores).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from torch_xdna.array import ir
from torch_xdna.array import txn as T
from torch_xdna.runtime.sim.txn_faults import PatternFault

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


def pad_walk(stream: torch.Tensor, dims: ir.Dims, pads, dtype: str) -> torch.Tensor:
    """A mem-tile MM2S walk's bytes with its zero padding inserted (objectfifo padDimensions:
    per dim, `before` and `after` units of zeros around the dim's run; a unit is the padded
    extent of the dims inside it)."""
    b = int(elem_bytes(dtype))
    block = torch.zeros(1, dtype=torch.long)
    n_data = 1
    for (size, _), (lo, hi) in zip(reversed(tuple(dims)), reversed(tuple(pads))):
        reps = torch.where((block >= 0).unsqueeze(0), block.unsqueeze(0)
                           + (torch.arange(size) * n_data).unsqueeze(1), block.unsqueeze(0)).reshape(-1)
        fill = lambda k: torch.full((k * block.numel(),), -1, dtype=torch.long)   # noqa: E731
        block = torch.cat([fill(lo), reps, fill(hi)])
        n_data *= size
    out = torch.zeros(block.numel(), b, dtype=torch.uint8)
    live = block >= 0
    out[live] = stream.reshape(-1, b)[block[live]]
    return out.reshape(-1)


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



# --- shim tasks --------------------------------------------------------------------------------------
@dataclass
class ShimTask:
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


class StreamCarry:
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



def task_data_elems(t: ir.DmaTask) -> int:
    return t.elements


def task_data_bytes(t: ir.DmaTask, dtype: str) -> int:
    return int(t.elements * elem_bytes(dtype))


def word_offsets(bd: T.ShimBD, repeat_count: int) -> torch.Tensor:
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


def bd_box(bd: T.ShimBD, repeat_count: int):
    """The words word_offsets enumerates as a strided box: (base word, ((size, stride), ...)
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


def _bd_view(buf: torch.Tensor, t: ShimTask):
    """The task's bytes of host buffer `buf` as a strided view (sizes..., 4), or None."""
    box = bd_box(t.bd, t.repeat_count)
    if box is None or buf.dim() != 1 or not buf.is_contiguous():
        return None
    base, dims = box
    sizes = tuple(n for n, _ in dims) + (4,)
    strides = tuple(4 * st for _, st in dims) + (1,)
    return buf.as_strided(sizes, strides, buf.storage_offset() + t.offset + 4 * base)


def read_bd(buf: torch.Tensor, t: ShimTask) -> torch.Tensor:
    """MM2S: the bytes one pushed BD reads, in stream order (a copy)."""
    v = _bd_view(buf, t)
    if v is None:
        return buf[_byte_offsets(t)]
    out = torch.empty(v.shape, dtype=buf.dtype)
    out.copy_(v)
    return out.reshape(-1)


def write_bd(buf: torch.Tensor, t: ShimTask, stream: torch.Tensor) -> None:
    """S2MM: write the stream bytes where the BD's pattern says (index writes when a stride-0
    dimension would write one word several times)."""
    v = _bd_view(buf, t)
    if v is None or any(st == 0 and n > 1 for n, st in zip(v.shape, v.stride())):
        buf[_byte_offsets(t)] = stream
        return
    v.copy_(stream.view(v.shape))


def _byte_offsets(t: ShimTask) -> torch.Tensor:
    w = word_offsets(t.bd, t.repeat_count)
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


def apply_pads(data: torch.Tensor, pm: torch.Tensor, dtype: str, repeat: int) -> torch.Tensor:
    b = elem_bytes(dtype)
    if b < 1:
        raise PatternFault(f"zero padding of sub-byte ({dtype}) elements is not supported by the DMA")
    b = int(b)
    src = torch.cat([data, torch.zeros(b, dtype=torch.uint8)])
    return src[_pad_index(pm, b, repeat, data.numel() // b, False)]


def drop_pads(stream: torch.Tensor, pm: torch.Tensor, dtype: str, repeat: int) -> torch.Tensor:
    b = int(elem_bytes(dtype))
    return stream[_pad_index(pm, b, repeat, 0, True)]

