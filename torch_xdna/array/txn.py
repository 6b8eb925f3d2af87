"""The NPU instruction stream: mlir-aie's transaction format (TXN 0.1) for AIE2/AIE2P.

What the host submits per launch (XRT opcode 3, hw/host.py) is a header plus a list of register
operations the NPU controller executes in order: write32, blockwrite, maskwrite32, sync (TCT
wait), DDR address patch, preempt, load-PDI. This module encodes and decodes those words exactly
as mlir-aie's AIETargetNPU.cpp / TxnEncoding.h emit them (golden tests: tests/test_txn_golden.py),
writes each task's shim BD from its AccessPattern (array/bd.py), and turns an ArrayProgram's runtime
sequence, bound to one launch's buffer sizes and scalars, into a stream. The static design
(tiles, FIFOs, cores) does not enter the stream: a new launch shape is a new stream of the same
build. Every opcode, register and field comes from hw/aie2p_regs.py.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Iterable, Sequence, Union

from torch_xdna.array import ir
# the BD vocabulary lives in array/bd.py; re-exported here because streams are made of it
from torch_xdna.array.bd import (AccessPattern, HwPattern, ShimBD, StreamError,  # noqa: F401
                                 bd_word_offsets, canonical_dims, hw_pattern, pack_memtile_bd,
                                 pack_shim_bd, task_bd, task_extent_bytes, unpack_shim_bd)
from torch_xdna.hw import aie2p_regs as R



# --- ops -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Write32:
    addr: int
    value: int


@dataclass(frozen=True)
class BlockWrite:
    addr: int
    data: tuple[int, ...]
    tile_word: int = 0          # word 1: column | row << 8 when the op names its tile


@dataclass(frozen=True)
class MaskWrite32:
    addr: int
    value: int
    mask: int


@dataclass(frozen=True)
class Sync:
    """TCT wait: block until `column_num` x `row_num` tiles from (column, row) report a
    task-complete token on `channel` of `direction` (0 = S2MM, 1 = MM2S)."""

    column: int
    row: int
    direction: int
    channel: int
    column_num: int = 1
    row_num: int = 1


@dataclass(frozen=True)
class DdrPatch:
    """Add host buffer `arg_idx`'s device address (+ arg_plus bytes) into register `addr`."""

    addr: int
    arg_idx: int
    arg_plus: int
    action: int = 0


@dataclass(frozen=True)
class Preempt:
    level: int


@dataclass(frozen=True)
class LoadPdi:
    id: int
    size: int
    addr: int


Op = Union[Write32, BlockWrite, MaskWrite32, Sync, DdrPatch, Preempt, LoadPdi]


@dataclass(frozen=True)
class Header:
    major: int = R.TXN_MAJOR.value
    minor: int = R.TXN_MINOR.value
    dev_gen: int = R.DEV_GEN.value["aie2p"]
    rows: int = R.ARRAY_ROWS.value
    columns: int = R.ARRAY_COLUMNS.value["npu2"]
    mem_tile_rows: int = R.MEM_TILE_ROWS.value
    op_count: int = 0
    size_bytes: int = 0


@dataclass(frozen=True)
class Transaction:
    header: Header
    ops: tuple[Op, ...]


def header_for(arch: str, columns: int) -> Header:
    """The header fields of a device: generation code and array geometry."""
    return Header(dev_gen=R.DEV_GEN.value[arch], columns=columns)


# --- encode / decode -------------------------------------------------------------------------------
def _u32(v: int, op: str, name: str) -> int:
    if not 0 <= v <= 0xFFFFFFFF:
        raise StreamError(f"{op}: field {name}={v} does not fit 32 bits")
    return v


def _u8(v: int, op: str, name: str) -> int:
    if not 0 <= v <= 0xFF:
        raise StreamError(f"{op}: field {name}={v} does not fit 8 bits")
    return v


def encode_op(op: Op) -> list[int]:
    """The words of one op (TxnEncoding.h layouts)."""
    if isinstance(op, Write32):
        return [R.OPC_WRITE.value, 0, _u32(op.addr, "write32", "addr"), 0,
                _u32(op.value, "write32", "value"), R.WRITE_WORDS.value * 4]
    if isinstance(op, MaskWrite32):
        return [R.OPC_MASKWRITE.value, 0, _u32(op.addr, "maskwrite32", "addr"), 0,
                _u32(op.value, "maskwrite32", "value"), _u32(op.mask, "maskwrite32", "mask"),
                R.MASKWRITE_WORDS.value * 4]
    if isinstance(op, BlockWrite):
        n = R.BLOCKWRITE_HEADER_WORDS.value + len(op.data)
        return [R.OPC_BLOCKWRITE.value, _u32(op.tile_word, "blockwrite", "tile_word"),
                _u32(op.addr, "blockwrite", "addr"), n * 4] + \
            [_u32(d, "blockwrite", "data") for d in op.data]
    if isinstance(op, Sync):
        w2 = _u8(op.direction, "sync", "direction") | _u8(op.row, "sync", "row") << 8 \
            | _u8(op.column, "sync", "column") << 16
        w3 = _u8(op.row_num, "sync", "row_num") << 8 | _u8(op.column_num, "sync", "column_num") << 16 \
            | _u8(op.channel, "sync", "channel") << 24
        return [R.OPC_TCT.value, R.TCT_WORDS.value * 4, w2, w3]
    if isinstance(op, DdrPatch):
        w = [0] * R.DDR_PATCH_WORDS.value
        s = R.DDR_PATCH_SLOTS.value
        w[0], w[1] = R.OPC_DDR_PATCH.value, R.DDR_PATCH_WORDS.value * 4
        w[s["action"]] = _u32(op.action, "ddr_patch", "action")
        w[s["addr"]] = _u32(op.addr, "ddr_patch", "addr")
        w[s["arg_idx"]] = _u32(op.arg_idx, "ddr_patch", "arg_idx")
        w[s["arg_plus"]] = _u32(op.arg_plus & 0xFFFFFFFF, "ddr_patch", "arg_plus")
        return w
    if isinstance(op, Preempt):
        return [R.OPC_PREEMPT.value | _u8(op.level, "preempt", "level") << 8]
    if isinstance(op, LoadPdi):
        if not 0 <= op.id <= 0xFFFF:
            raise StreamError(f"load_pdi: field id={op.id} does not fit 16 bits")
        return [R.OPC_LOADPDI.value | op.id << 16, _u32(op.size, "load_pdi", "size"),
                op.addr & 0xFFFFFFFF, (op.addr >> 32) & 0xFFFFFFFF]
    raise StreamError(f"cannot encode {type(op).__name__}: not a transaction op")


def encode(ops: Iterable[Op], header: Header | None = None) -> list[int]:
    """A whole transaction: 4-word header (op count, total bytes) then the ops' words."""
    h = header or Header()
    body: list[int] = []
    n = 0
    for op in ops:
        body += encode_op(op)
        n += 1
    w0 = h.rows << 24 | h.dev_gen << 16 | h.minor << 8 | h.major
    w1 = h.mem_tile_rows << 8 | h.columns
    return [w0, w1, n, (len(body) + R.HEADER_WORDS.value) * 4] + body


def decode(words: Sequence[int]) -> Transaction:
    """Parse a transaction; a malformed stream raises StreamError naming the op index and field."""
    words = list(words)
    if len(words) < R.HEADER_WORDS.value:
        raise StreamError(f"transaction header: {len(words)} words, needs {R.HEADER_WORDS.value}")
    w0, w1, count, size = words[:4]
    header = Header(major=w0 & 0xFF, minor=(w0 >> 8) & 0xFF, dev_gen=(w0 >> 16) & 0xFF,
                    rows=(w0 >> 24) & 0xFF, columns=w1 & 0xFF, mem_tile_rows=(w1 >> 8) & 0xFF,
                    op_count=count, size_bytes=size)
    if (header.major, header.minor) != (R.TXN_MAJOR.value, R.TXN_MINOR.value):
        raise StreamError(f"transaction header: version {header.major}.{header.minor} is not "
                          f"{R.TXN_MAJOR.value}.{R.TXN_MINOR.value}")
    if size != len(words) * 4:
        raise StreamError(f"transaction header: size field {size} bytes but the stream has "
                          f"{len(words) * 4}")
    ops: list[Op] = []
    i = R.HEADER_WORDS.value
    while i < len(words):
        k = len(ops)
        opc = words[i] & 0xFF

        def need(n: int, name: str) -> list[int]:
            if i + n > len(words):
                raise StreamError(f"op {k} ({name}): truncated, needs {n} words at word {i}")
            return words[i:i + n]

        if opc == R.OPC_WRITE.value:
            w = need(R.WRITE_WORDS.value, "write32")
            if w[5] != R.WRITE_WORDS.value * 4:
                raise StreamError(f"op {k} (write32): size field {w[5]}, expected {R.WRITE_WORDS.value * 4}")
            ops.append(Write32(w[2], w[4]))
            i += R.WRITE_WORDS.value
        elif opc == R.OPC_MASKWRITE.value:
            w = need(R.MASKWRITE_WORDS.value, "maskwrite32")
            if w[6] != R.MASKWRITE_WORDS.value * 4:
                raise StreamError(f"op {k} (maskwrite32): size field {w[6]}")
            ops.append(MaskWrite32(w[2], w[4], w[5]))
            i += R.MASKWRITE_WORDS.value
        elif opc == R.OPC_BLOCKWRITE.value:
            w = need(R.BLOCKWRITE_HEADER_WORDS.value, "blockwrite")
            n = w[3] // 4
            if w[3] % 4 or n < R.BLOCKWRITE_HEADER_WORDS.value:
                raise StreamError(f"op {k} (blockwrite): size field {w[3]} is not a word count >= 4")
            w = need(n, "blockwrite")
            ops.append(BlockWrite(w[2], tuple(w[4:n]), w[1]))
            i += n
        elif opc == R.OPC_TCT.value:
            w = need(R.TCT_WORDS.value, "sync")
            if w[1] != R.TCT_WORDS.value * 4:
                raise StreamError(f"op {k} (sync): size field {w[1]}")
            ops.append(Sync(column=(w[2] >> 16) & 0xFF, row=(w[2] >> 8) & 0xFF, direction=w[2] & 0xFF,
                            channel=(w[3] >> 24) & 0xFF, column_num=(w[3] >> 16) & 0xFF,
                            row_num=(w[3] >> 8) & 0xFF))
            i += R.TCT_WORDS.value
        elif opc == R.OPC_DDR_PATCH.value:
            w = need(R.DDR_PATCH_WORDS.value, "ddr_patch")
            if w[1] != R.DDR_PATCH_WORDS.value * 4:
                raise StreamError(f"op {k} (ddr_patch): size field {w[1]}")
            s = R.DDR_PATCH_SLOTS.value
            ops.append(DdrPatch(w[s["addr"]], w[s["arg_idx"]], w[s["arg_plus"]], w[s["action"]]))
            i += R.DDR_PATCH_WORDS.value
        elif opc == R.OPC_PREEMPT.value:
            ops.append(Preempt((words[i] >> 8) & 0xFF))
            i += R.PREEMPT_WORDS.value
        elif opc == R.OPC_LOADPDI.value:
            w = need(R.LOADPDI_WORDS.value, "load_pdi")
            ops.append(LoadPdi(w[0] >> 16, w[1], w[2] | w[3] << 32))
            i += R.LOADPDI_WORDS.value
        else:
            raise StreamError(f"op {k}: unknown opcode 0x{opc:02X} at word {i}")
    if len(ops) != count:
        raise StreamError(f"transaction header: op count {count} but the stream holds {len(ops)} ops")
    return Transaction(header, tuple(ops))


def to_bytes(words: Sequence[int]) -> bytes:
    """Little-endian bytes, the instruction buffer the host copies into its BO."""
    return struct.pack(f"<{len(words)}I", *words)


def from_bytes(data: bytes) -> list[int]:
    if len(data) % 4:
        raise StreamError(f"instruction buffer of {len(data)} bytes is not whole 32-bit words")
    return list(struct.unpack(f"<{len(data) // 4}I", data))


def to_hex(words: Sequence[int]) -> str:
    """One word per line, upper-case hex: aie-translate --aie-npu-to-binary -aie-output-binary=false."""
    return "".join(f"{w:08X}\n" for w in words)


# --- register classification (shared by stats and the simulator) ----------------------------------
@dataclass(frozen=True)
class QueuePush:
    column: int
    direction: str
    channel: int
    bd_id: int
    repeat_count: int
    issue_token: bool


def queue_register(addr: int) -> tuple[int, str, int] | None:
    """(column, direction, channel) if `addr` is a shim task-queue register."""
    col, row, off = R.split_address(addr)
    if row != 0:
        return None
    for d in ir.DIRECTIONS:
        for ch in range(R.SHIM_CHANNELS.value):
            if off == R.shim_queue_offset(d, ch):
                return col, d, ch
    return None


def bd_register(addr: int) -> tuple[int, int, int] | None:
    """(column, bd id, word index) if `addr` lies in a shim BD."""
    col, row, off = R.split_address(addr)
    base, stride = R.SHIM_BD_BASE.value, R.SHIM_BD_STRIDE.value
    if row != 0 or not base <= off < base + R.SHIM_BDS.value * stride:
        return None
    return col, (off - base) // stride, ((off - base) % stride) // 4


def decode_push(op: Write32) -> QueuePush | None:
    q = queue_register(op.addr)
    if q is None:
        return None
    f = R.TASK_QUEUE_FIELDS.value
    return QueuePush(q[0], q[1], q[2], f["start_bd_id"].get(op.value), f["repeat_count"].get(op.value),
                     bool(f["enable_token_issue"].get(op.value)))


def encode_push(column: int, direction: str, channel: int, bd_id: int, repeat_count: int,
                issue_token: bool) -> Write32:
    f = R.TASK_QUEUE_FIELDS.value
    try:
        v = f["start_bd_id"].place(bd_id) | f["repeat_count"].place(repeat_count) \
            | f["enable_token_issue"].place(int(issue_token))
    except ValueError as e:
        raise StreamError(f"task-queue push (column {column} {direction}{channel}): {e} "
                          f"(bd_id={bd_id}, repeat_count={repeat_count})") from None
    return Write32(R.tile_address(column, 0, R.shim_queue_offset(direction, channel)), v)


# --- runtime sequence -> stream ----------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchBinding:
    """What one launch binds: each host argument's size in bytes and the launch scalars."""

    arg_bytes: tuple[int, ...]
    scalars: tuple[tuple[str, Union[int, float]], ...] = ()

    @classmethod
    def of(cls, arg_bytes: Sequence[int], **scalars) -> "LaunchBinding":
        return cls(tuple(int(b) for b in arg_bytes), tuple(sorted(scalars.items())))

    def scalar(self, name: str):
        for k, v in self.scalars:
            if k == name:
                return v
        raise StreamError(f"launch scalar {name!r} is not bound; bound: {[k for k, _ in self.scalars]}")


DIRECTION_CODE = {"S2MM": 0, "MM2S": 1}      # mlir-aie DMAChannelDir (sync direction field)
RTP_BASE = 0x400                            # first data-memory byte after mlir-aie's default 1 KiB stack


def rtp_layout(program: ir.ArrayProgram) -> dict[str, tuple[ir.Tile, int]]:
    """Tile-local byte address of each runtime-parameter buffer: packed after the stack, in
    declaration order, 16-byte aligned (our allocation; aiecc assigns its own in a real build)."""
    out: dict[str, tuple[ir.Tile, int]] = {}
    nxt: dict[ir.Tile, int] = {}
    for b in program.buffers:
        if not b.rtp:
            continue
        at = nxt.get(b.tile, RTP_BASE)
        out[b.name] = (b.tile, at)
        nxt[b.tile] = at + (b.type.nbytes + 15) // 16 * 16
    return out


def _rtp_word(value, dtype: str) -> int:
    if dtype == "f32":
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    return int(value) & 0xFFFFFFFF


def encode_sequence(program: ir.ArrayProgram, binding: LaunchBinding | None = None,
                    fold_ddr_offset: bool = True) -> list[int]:
    """The instruction stream of one launch of `program`: per DMA task a BD blockwrite, a DDR
    patch of its base address and a task-queue push; per awaited task a sync; RTP writes."""
    seq = program.sequence
    arch = "aie2p" if program.generation != "npu1" else "aie2"
    args = {a.name: (i, a) for i, a in enumerate(seq.args)}
    if binding is not None and len(binding.arg_bytes) != len(seq.args):
        raise StreamError(f"{program.name}: launch binds {len(binding.arg_bytes)} buffers, the runtime "
                          f"sequence takes {len(seq.args)} ({', '.join(args)})")
    tasks = {t.id: t for t in seq.tasks}
    rtps = rtp_layout(program) if any(isinstance(o, ir.RtpWrite) for o in seq.ops) else {}
    ops: list[Op] = []
    for op in seq.ops:
        if isinstance(op, ir.DmaTask):
            if op.elements == 0:
                continue      # all padding: the mem-tile DMA supplies (or drops) it, no shim BD
            if op.arg not in args:
                raise StreamError(f"{program.name}: dma task {op.id} reads argument {op.arg!r}, not one "
                                  f"of {list(args)}")
            idx, arg = args[op.arg]
            if binding is not None:
                lo, hi = task_extent_bytes(op, arg)
                if hi > binding.arg_bytes[idx]:
                    raise StreamError(f"{program.name}: dma task {op.id} ({op.fifo}) reaches byte {hi} of "
                                      f"argument {op.arg!r}, which holds {binding.arg_bytes[idx]} bytes")
            if not 0 <= op.bd_id < R.SHIM_BDS.value:
                raise StreamError(f"{program.name}: dma task {op.id}: field bd_id={op.bd_id} outside "
                                  f"0..{R.SHIM_BDS.value - 1}")
            bd, pat = task_bd(op, arg, arch)
            bd_off = R.shim_bd_offset(op.bd_id)
            ops.append(BlockWrite(R.tile_address(op.column, 0, bd_off), tuple(pack_shim_bd(bd))))
            plus = op.offset * ir.DTYPE_BITS[arg.type.dtype] // 8
            if fold_ddr_offset and idx >= R.DDR_FOLD_FIRST_ARG.value:
                plus += R.DDR_FOLD_OFFSET.value
            ops.append(DdrPatch(R.tile_address(op.column, 0, bd_off + R.SHIM_BD_ADDR_OFFSET.value), idx, plus))
            token = op.issue_token or op.direction == "S2MM"     # mlir-aie: S2MM always issues one
            ops.append(encode_push(op.column, op.direction, op.channel, op.bd_id, pat.repeat_count, token))
        elif isinstance(op, ir.Await):
            for tid in op.tasks:
                t = tasks.get(tid)
                if t is None:
                    raise StreamError(f"{program.name}: await of unknown dma task {tid}")
                if t.elements == 0:
                    continue
                ops.append(Sync(t.column, 0, DIRECTION_CODE[t.direction], t.channel, 1, 1))
        elif isinstance(op, ir.Free):
            continue                                   # BD bookkeeping only: no register write
        elif isinstance(op, ir.RtpWrite):
            tile, base = rtps[op.buffer]
            buf = program.buffer(op.buffer)
            v = op.value
            if isinstance(v, ir.ScalarRef):
                if binding is None:
                    raise StreamError(f"{program.name}: rtp write of scalar {v.name!r} needs a launch binding")
                v = binding.scalar(v.name)
            ops.append(Write32(R.tile_address(tile.col, tile.row, base + 4 * op.index),
                               _rtp_word(v, buf.type.dtype)))
        else:
            raise StreamError(f"{program.name}: runtime-sequence op {type(op).__name__} has no encoding")
    columns = max([t.col for t in program.tiles] + [0]) + 1
    gen_cols = R.ARRAY_COLUMNS.value["npu2" if arch == "aie2p" else "npu1"]
    return encode(ops, header_for(arch, max(columns, gen_cols)))


# --- stream statistics (the cost model counts these) -----------------------------------------------
@dataclass(frozen=True)
class StreamStats:
    words: int
    ops: int
    bd_writes: int
    patches: int
    pushes: int
    syncs: int
    other_writes: int
    mm2s_bytes: int
    s2mm_bytes: int
    bds_by_column: tuple[tuple[int, int], ...] = field(default=())
    sync_groups: int = 0        # maximal runs of consecutive syncs: the host-visible wait points

    @property
    def bytes(self) -> int:
        return self.words * 4


def stream_stats(words: Sequence[int]) -> StreamStats:
    """Counts taken from the stream itself: BD writes, patches, pushes, syncs and the bytes the
    pushed BDs move (buffer_length x runs)."""
    tx = decode(words)
    bds: dict[tuple[int, int], ShimBD] = {}
    n_bd = n_patch = n_push = n_sync = n_other = 0
    mm2s = s2mm = 0
    per_col: dict[int, set] = {}
    groups, prev_sync = 0, False
    for op in tx.ops:
        is_sync = isinstance(op, Sync)
        groups += is_sync and not prev_sync
        prev_sync = is_sync
        if isinstance(op, BlockWrite) and (loc := bd_register(op.addr)) and loc[2] == 0 \
                and len(op.data) == R.SHIM_BD_WORDS.value:
            bds[(loc[0], loc[1])] = unpack_shim_bd(op.data)
            per_col.setdefault(loc[0], set()).add(loc[1])
            n_bd += 1
        elif isinstance(op, DdrPatch):
            n_patch += 1
        elif isinstance(op, Write32) and (p := decode_push(op)) is not None:
            n_push += 1
            bd = bds.get((p.column, p.bd_id))
            moved = bd.buffer_length * 4 * (p.repeat_count + 1) if bd else 0
            if p.direction == "MM2S":
                mm2s += moved
            else:
                s2mm += moved
        elif isinstance(op, Sync):
            n_sync += 1
        else:
            n_other += 1
    return StreamStats(len(words), len(tx.ops), n_bd, n_patch, n_push, n_sync, n_other, mm2s, s2mm,
                       tuple(sorted((c, len(v)) for c, v in per_col.items())), groups)
