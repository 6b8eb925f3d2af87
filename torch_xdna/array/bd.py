"""Buffer descriptors: a DMA task's access pattern and the BD words it becomes.

`AccessPattern` is the one description of a shim DMA task's walk (offset, up to 4 dims of
size/stride outermost first, task-queue repeat, edge padding); array/mlir.py prints its
`aie.dma_bd` (length = the lowest three dims, the fourth dim as the task's `repeat_count`) and
array/txn.py encodes its BD words from the same object, so the two cannot disagree. The field
packing follows mlir-aie's AIEDmaToNpu.cpp / AIEDMATasksToNPU.cpp (rewriteSingleBD) and
AIEXDialect.cpp (getHardwareStridesWraps, verifyStridesWraps); registers from hw/aie2p_regs.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from torch_xdna.array import ir
from torch_xdna.hw import aie2p_regs as R


class StreamError(ValueError):
    """An instruction stream cannot be encoded or decoded: names the op, the field and the value."""


# --- buffer descriptors ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ShimBD:
    """One shim DMA buffer descriptor, in hardware units (32-bit words; strides minus one)."""

    buffer_length: int
    base_address_low: int = 0
    base_address_high: int = 0
    enable_packet: int = 0
    out_of_order_id: int = 0
    packet_id: int = 0
    packet_type: int = 0
    d0_size: int = 0
    d0_stride: int = 0
    d1_size: int = 0
    d1_stride: int = 0
    d2_stride: int = 0
    burst_length: int = 0
    axcache: int = 0
    iteration_current: int = 0
    iteration_size: int = 0
    iteration_stride: int = 0
    next_bd: int = 0
    use_next_bd: int = 0
    valid_bd: int = 1
    lock_rel_val: int = 0
    lock_rel_id: int = 0
    lock_acq_enable: int = 0
    lock_acq_val: int = 0
    lock_acq_id: int = 0


def _pack(fields: dict, values: dict, nwords: int, what: str) -> list[int]:
    words = [0] * nwords
    for name, v in values.items():
        f = fields[name]
        try:
            words[f.word] |= f.place(int(v))
        except ValueError:
            raise StreamError(f"{what}: field {name}={v} does not fit its {f.width}-bit field "
                              f"(word {f.word}, bits {f.lsb + f.width - 1}:{f.lsb})") from None
    return words


def pack_shim_bd(bd: ShimBD) -> list[int]:
    fields = R.SHIM_BD_FIELDS.value
    return _pack(fields, {k: getattr(bd, k) for k in bd.__dataclass_fields__}, R.SHIM_BD_WORDS.value,
                 "shim BD")


def unpack_shim_bd(words: Sequence[int]) -> ShimBD:
    if len(words) != R.SHIM_BD_WORDS.value:
        raise StreamError(f"shim BD: {len(words)} words, expected {R.SHIM_BD_WORDS.value}")
    fields = R.SHIM_BD_FIELDS.value
    return ShimBD(**{k: fields[k].get(words[fields[k].word]) for k in ShimBD.__dataclass_fields__})


def pack_memtile_bd(**values: int) -> list[int]:
    """A mem-tile BD (npu.writebd on row 1), fields by AIEDmaToNpu.cpp's attribute names."""
    return _pack(R.MEMTILE_BD_FIELDS.value, values, R.SHIM_BD_WORDS.value, "mem-tile BD")


@dataclass(frozen=True)
class HwPattern:
    """A shim access pattern in BD fields (mlir-aie getHardwareStridesWraps)."""

    buffer_length: int      # words per BD execution
    d0_size: int
    d0_stride: int
    d1_size: int
    d1_stride: int
    d2_stride: int
    iteration_size: int
    iteration_stride: int
    repeat_count: int       # task-queue repeat (0 = run once)
    linear: bool


def canonical_dims(sizes: Sequence[int], strides: Sequence[int], what: str = "dma task"
                   ) -> tuple[list[int], list[int]]:
    """4-D (outermost first) sizes/strides: leading size-1 dims dropped, and an outermost
    zero-stride dim (a repeat, e.g. a broadcast row) moved to dimension 3, the only one whose
    stride may be 0 (the BD then repeats via the task queue's repeat count)."""
    sizes, strides = [int(s) for s in sizes], [int(s) for s in strides]
    if len(sizes) != len(strides):
        raise StreamError(f"{what}: {len(sizes)} sizes but {len(strides)} strides")
    while len(sizes) > 1 and sizes[0] == 1:
        sizes, strides = sizes[1:], strides[1:]
    if len(sizes) > 4:
        raise StreamError(f"{what}: {len(sizes)}-D pattern, the shim BD has 4 dimensions")
    if len(sizes) > 1 and strides[0] == 0:
        return [sizes[0]] + [1] * (4 - len(sizes)) + sizes[1:], [0] + [0] * (4 - len(sizes)) + strides[1:]
    return [1] * (4 - len(sizes)) + sizes, [0] * (4 - len(strides)) + strides


def hw_pattern(sizes: Sequence[int], strides: Sequence[int], elem_bits: int, repeat: int = 1,
               what: str = "dma task") -> HwPattern:
    """Convert a 4-D (outermost first, element units) pattern to shim BD fields, with mlir-aie's
    checks (verifyStridesWraps): sizes positive, innermost run whole words, fields in range."""
    sizes, strides = canonical_dims(sizes, strides, what)
    s = list(reversed(sizes))        # innermost first, as mlir-aie orders them
    t = list(reversed(strides))
    g = R.ADDRESS_GRANULARITY_BITS.value
    for i in range(4):
        if s[i] <= 0:
            raise StreamError(f"{what}: size {i} = {s[i]} must be positive")
    if s[0] * elem_bits % g:
        raise StreamError(f"{what}: innermost run of {s[0]} x {elem_bits}-bit elements is not a whole "
                          f"number of 32-bit words (field d0_size)")
    for i in range(1, 4):
        if s[i] > 1 and t[i] * elem_bits % g:
            raise StreamError(f"{what}: stride {i} = {t[i]} elements is not a whole number of 32-bit "
                              f"words (field d{i}_stride)")
    if s[0] > 1 and t[0] != 1:
        raise StreamError(f"{what}: innermost stride {t[0]} must be 1 (contiguous words)")
    linear = s[1] == 1 and s[2] == 1
    words = lambda n: n * elem_bits // g                       # noqa: E731
    hs = [words(s[0]), s[1], s[2], 0]
    ht = [0, words(t[1]) - 1 if s[1] > 1 else 0, words(t[2]) - 1 if s[2] > 1 else 0, 0]
    if s[3] > 1:
        hs[3] = s[3] - 1
        if t[3] > 0:
            ht[3] = words(t[3]) - 1
    wrap_max = (1 << R.SHIM_WRAP_BITS.value) - 1
    step_max = 1 << R.SHIM_STEP_BITS.value
    if not linear:
        for name, v, lim in (("d0_size", hs[0], wrap_max), ("d1_size", hs[1], wrap_max),
                             ("d0_stride", ht[0], step_max), ("d1_stride", ht[1], step_max),
                             ("d2_stride", ht[2], step_max)):
            if v > lim:
                raise StreamError(f"{what}: field {name}={v} exceeds the shim BD limit {lim}")
    if hs[3] > (1 << R.SHIM_ITER_BITS.value):
        raise StreamError(f"{what}: field iteration_size={hs[3]} exceeds {1 << R.SHIM_ITER_BITS.value}")
    if ht[3] > step_max and hs[3] > 0:
        raise StreamError(f"{what}: field iteration_stride={ht[3]} exceeds {step_max}")
    length = words(s[0]) * s[1] * s[2]
    reps = s[3] * max(1, int(repeat))
    if reps - 1 > 0xFF:
        raise StreamError(f"{what}: repeat_count={reps - 1} exceeds the task queue's 8-bit field")
    iter_size = hs[3] if t[3] > 0 else 0
    return HwPattern(length, 0 if linear else hs[0], 0 if linear else ht[0], 0 if linear else hs[1],
                     0 if linear else ht[1], 0 if linear else ht[2], iter_size,
                     ht[3] if t[3] > 0 else 0, reps - 1, linear)


def bd_word_offsets(bd: ShimBD, repeat_count: int = 0) -> list[int]:
    """Every 32-bit word offset (relative to the BD's base address) one task touches, in stream
    order: the BD runs repeat_count + 1 times, advancing the iteration dimension each run."""
    L = bd.buffer_length
    out: list[int] = []
    if bd.d0_size == 0 and bd.d1_size == 0:                     # linear
        base_pat = list(range(L))
    else:
        d0 = max(bd.d0_size, 1)
        d1 = max(bd.d1_size, 1)
        s0, s1, s2 = bd.d0_stride + 1, bd.d1_stride + 1, bd.d2_stride + 1
        base_pat = [(i % d0) * s0 + ((i // d0) % d1) * s1 + (i // (d0 * d1)) * s2 for i in range(L)]
    wrap = bd.iteration_size + 1
    step = bd.iteration_stride + 1 if bd.iteration_size else 0
    for r in range(repeat_count + 1):
        it = (bd.iteration_current + r) % wrap
        off = it * step
        out.extend(p + off for p in base_pat)
    return out


def split_wide_innermost(dims: tuple[tuple[int, int], ...], elem_bits: int, wrap_words: int,
                         granularity_bits: int = 32) -> tuple[tuple[int, int], ...]:
    """The same walk with a contiguous innermost dim longer than a BD's size field (mlir-aie
    verifyStridesWraps: 'Size 0 exceeds the [0:1023] range') split in two: (n, 1) becomes
    (n / k, k), (k, 1) with k the largest divisor of n that fits the field in whole words.
    Addresses and their order are unchanged."""
    if not dims:
        return dims
    n, stride = dims[-1]
    if stride != 1 or n * elem_bits // granularity_bits <= wrap_words:
        return dims
    for k in range(wrap_words * granularity_bits // elem_bits, 0, -1):
        if n % k == 0 and k * elem_bits % granularity_bits == 0:
            return tuple(dims[:-1]) + ((n // k, k), (k, 1))
    return dims


# --- one DMA task's access pattern ------------------------------------------------------------------
@dataclass(frozen=True)
class AccessPattern:
    """A shim DMA task's walk over its host buffer, in elements of the buffer's dtype.

    `sizes`/`strides` as the task gives them (outermost first, <= 4 after leading size-1 dims
    are dropped); `dims` is the canonical 4-D form both the MLIR and the BD words use."""

    offset: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    repeat: int = 1
    pad_after: tuple[int, ...] = ()

    @classmethod
    def of(cls, task: ir.DmaTask) -> "AccessPattern":
        return cls(int(task.offset), tuple(task.sizes), tuple(task.strides), int(task.repeat),
                   tuple(task.pad_after))

    @property
    def dims(self) -> tuple[tuple[int, int], ...]:
        """Canonical 4-D ((size, stride), ...) outermost first (canonical_dims)."""
        sizes, strides = canonical_dims(self.sizes, self.strides)
        return tuple(zip(sizes, strides))

    @property
    def printed_dims(self) -> tuple[tuple[int, int], ...]:
        """`dims` as the MLIR's aie.dma_bd spells them: leading size-1 dims left out (upstream
        reads missing dims as size 1)."""
        dims = self.dims
        while len(dims) > 1 and dims[0][0] == 1:
            dims = dims[1:]
        return dims

    @classmethod
    def from_printed(cls, offset: int, dims: tuple[tuple[int, int], ...],
                     repeat_count: int) -> "AccessPattern":
        """The pattern an aie.dma_bd's dims and its task's repeat_count describe (the inverse of
        printed_dims / repeat_count, in canonical form)."""
        outer = dims[0][0] if len(dims) == 4 else 1
        return cls(int(offset), tuple(s for s, _ in dims), tuple(st for _, st in dims),
                   (repeat_count + 1) // outer)

    @property
    def bd_len(self) -> int:
        """Elements of one BD run: the lowest three dims (AIEDMATasksToNPU.cpp requires the BD
        length to leave out the highest dim, which is the task's repeat count)."""
        (_, _), (s2, _), (s1, _), (s0, _) = self.dims
        return s2 * s1 * s0

    @property
    def repeat_count(self) -> int:
        """The task-queue repeat count: the highest dim's size times `repeat`, minus one."""
        return self.dims[0][0] * max(1, self.repeat) - 1

    @property
    def elements(self) -> int:
        return math.prod(self.sizes) * self.repeat

    def hw(self, elem_bits: int, what: str = "dma task") -> HwPattern:
        return hw_pattern(self.sizes, self.strides, elem_bits, self.repeat, what)


def task_bd(task: ir.DmaTask, arg: ir.HostArg, arch: str = "aie2p") -> tuple[ShimBD, HwPattern]:
    """The shim BD of one DMA task (its address fields left for the DDR patch)."""
    bits = ir.DTYPE_BITS[arg.type.dtype]
    pat = AccessPattern.of(task).hw(bits, what=f"dma task {task.id} ({task.fifo})")
    bd = ShimBD(buffer_length=pat.buffer_length, d0_size=pat.d0_size, d0_stride=pat.d0_stride,
                d1_size=pat.d1_size, d1_stride=pat.d1_stride, d2_stride=pat.d2_stride,
                iteration_size=pat.iteration_size, iteration_stride=pat.iteration_stride,
                burst_length=R.default_burst_encoding(arch), axcache=R.SHIM_AXCACHE_DEFAULT.value,
                valid_bd=1)
    return bd, pat


def task_extent_bytes(task: ir.DmaTask, arg: ir.HostArg) -> tuple[int, int]:
    """(first, last + 1) byte a task touches in its host argument."""
    bits = ir.DTYPE_BITS[arg.type.dtype]
    hi = task.offset
    for sz, st in zip(task.sizes, task.strides):
        hi += (sz - 1) * st
    return task.offset * bits // 8, (hi + 1) * bits // 8 + (0 if bits >= 8 else 1)
