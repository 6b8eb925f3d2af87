"""The rules mlir-aie (aiecc and the AIE/AIEX dialect verifiers) enforces, checked on an
ArrayProgram before anything is printed or built: `verify(prog, gen) -> [Violation]`.

Each rule is one small function registered with its name, its citation (repository, path and
commit, or "index version" where the code-search index gave the text without a commit) and the
upstream error text it mirrors. Limits come from hw/ (Generation fields with their sources),
never from constants here. Capacity rules (memory, BDs, locks, channels) read array/usage.py's
counts; array/validate.py runs the same capacity rules against the project's own, stricter
budget (L1 minus the engine's stack reserve) instead of upstream's, so the two never disagree on
what is counted. The kernel-contract rule needs the caller's C++ kernel table (kernels/ is above
array/): pass `contract=` (kernels.toolchain.build.kernel_contract_errors does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from torch_xdna.array import ir
from torch_xdna.array.bd import AccessPattern, StreamError, canonical_dims
from torch_xdna.array.mlir import printed_dims_to_stream
from torch_xdna.array.usage import Usage, endpoint_bds, usage, walk
from torch_xdna.hw import Generation, get_generation

MLIR_AIE = "Xilinx/mlir-aie"
AT_0155 = "@ 0155ebd7c8b77cd6846781dd0597a7adee9a7620"
TASKS_TO_NPU = f"{MLIR_AIE} lib/Dialect/AIEX/Transforms/AIEDMATasksToNPU.cpp {AT_0155} (rewriteSingleBD)"
AIEX_DIALECT = f"{MLIR_AIE} lib/Dialect/AIEX/IR/AIEXDialect.cpp {AT_0155}"
AIE_OPS_TD = f"{MLIR_AIE} include/aie/Dialect/AIE/IR/AIEOps.td {AT_0155}"
AIE_DIALECT = f"{MLIR_AIE} lib/Dialect/AIE/IR/AIEDialect.cpp (index version, no commit)"
TARGET_MODEL = f"{MLIR_AIE} include/aie/Dialect/AIE/IR/AIETargetModel.h (index version, no commit)"
STATEFUL = (f"{MLIR_AIE} lib/Dialect/AIE/Transforms/AIEObjectFifoStatefulTransform.cpp "
            "(index version, no commit)")
ASSIGN_BUFFERS = f"{MLIR_AIE} lib/Dialect/AIE/Transforms/AIEAssignBuffers.cpp (index version, no commit)"
LINK_FILES = (f"{MLIR_AIE} lib/Dialect/AIE/Transforms/AIEAssignCoreLinkFiles.cpp @ "
              "190ec66fb35f9269b3edba642d31653de10e8829 (PR #2922)")

Contract = Callable[[ir.ArrayProgram], list[str]]


@dataclass(frozen=True)
class Violation:
    """One broken upstream rule: which, where in the program, what, and where upstream says so."""

    rule: str
    where: str
    message: str
    citation: str

    def line(self) -> str:
        return f"{self.rule}: {self.where}: {self.message} [{self.citation}]"


@dataclass
class Context:
    """What the rules share: the generation, usage counts, the L1 budget and the kernel contract."""

    gen: Generation
    u: Usage
    l1_limit: int
    contract: Contract | None = None


@dataclass(frozen=True)
class Rule:
    name: str
    citation: str
    upstream: str                 # the upstream error text this rule mirrors
    check: Callable[[ir.ArrayProgram, Context], Iterable[tuple[str, str]]] = field(repr=False)


RULES: dict[str, Rule] = {}
CAPACITY = ("l1_memory", "memtile_memory", "bds_per_tile", "locks_per_tile", "dma_channels",
            "shim_bds_in_flight")


def rule(name: str, citation: str, upstream: str):
    """Register a check yielding (where, message) per violation."""
    def wrap(fn):
        RULES[name] = Rule(name, citation, upstream, fn)
        return fn
    return wrap


def _exceeded(what: str, needed: int, available: int) -> str:
    return f"{what} exceeded: needs {needed}, hardware has {available}"


# --- runtime-sequence (shim) buffer descriptors -----------------------------------------------------
def _tasks(prog: ir.ArrayProgram) -> Iterator[tuple[ir.DmaTask, int, str]]:
    args = {a.name: a for a in prog.sequence.args}
    for t in prog.sequence.tasks:
        if t.arg in args:
            yield t, ir.DTYPE_BITS[args[t.arg].type.dtype], f"dma task {t.id} ({t.fifo})"


@rule("bd_length", TASKS_TO_NPU,
      "Buffer descriptor length does not match length of transfer expressed by lowest three "
      "dimensions of data layout transformation strides/wraps. / Transfer size of N bytes falls "
      "below minimum hardware transfer unit of 4 bytes. / At most four data layout "
      "transformation dimensions may be provided.")
def _bd_length(prog, ctx):
    g = ctx.gen.dma_granularity_bytes.value
    for t, bits, where in _tasks(prog):
        try:
            pat = AccessPattern.of(t)
            dims = pat.dims
        except StreamError as e:
            yield where, str(e)
            continue
        if pat.bd_len * (pat.repeat_count + 1) != pat.elements:
            yield where, (f"BD length {pat.bd_len} x {pat.repeat_count + 1} runs != the "
                          f"{pat.elements} elements of dims {dims}")
        nbytes = pat.bd_len * bits // 8
        if nbytes < g:
            yield where, f"transfer size of {nbytes} bytes falls below the {g}-byte unit"


@rule("repeat_count_range", AIEX_DIALECT + " (NpuPushQueueOp::verify)",
      "Repeat count exceeds the [0:255] range.")
def _repeat_range(prog, ctx):
    hi = ctx.gen.task_repeat_max.value
    for t, _, where in _tasks(prog):
        try:
            rc = AccessPattern.of(t).repeat_count
        except StreamError:
            continue                                 # bd_length names it
        if rc > hi:
            yield where, f"repeat_count {rc} exceeds the [0:{hi}] range"


@rule("bd_id_range", AIEX_DIALECT + " (NpuPushQueueOp::verify); " + TARGET_MODEL + " getNumBDs",
      "BD ID exceeds the maximum ID.")
def _bd_id(prog, ctx):
    n = ctx.gen.shim_bds.value
    for t, _, where in _tasks(prog):
        if not 0 <= t.bd_id < n:
            yield where, f"bd_id {t.bd_id} outside 0..{n - 1}"


# --- access patterns (shim tasks and object-FIFO BDs) ---------------------------------------------
def _patterns(prog: ir.ArrayProgram) -> Iterator[tuple[str, str, list[int], list[int], int]]:
    """(where, tile kind, sizes, strides innermost first padded to 4, element bits) of every DMA
    access pattern: shim tasks as printed (canonical 4-D), each fifo's dims on both ends."""
    for t, bits, where in _tasks(prog):
        try:
            sizes, strides = canonical_dims(t.sizes, t.strides)
        except StreamError:
            continue
        yield where, "shim", sizes[::-1], strides[::-1], bits
    for f in prog.fifos:
        bits = ir.DTYPE_BITS[f.elem.dtype]
        sides = [(f.producer, printed_dims_to_stream(prog, f), "dimensionsToStream")]
        sides += [(c, d, "dimensionsFromStream") for c, d in zip(f.consumers, f.dims_from_stream)]
        for tile, dims, what in sides:
            if dims:
                s = [d[0] for d in reversed(dims)] + [1] * (4 - len(dims))
                st = [d[1] for d in reversed(dims)] + [0] * (4 - len(dims))
                yield f"fifo {f.name} {what} on {tile.name}", tile.kind, s, st, bits


@rule("bd_dims", AIE_DIALECT + " (DMABDOp::verify); " + TASKS_TO_NPU,
      "Cannot give more than N dimensions for step sizes and wraps in this tile (got M dimensions).")
def _bd_dims(prog, ctx):
    lim = ctx.gen.dma_bd_dims.value
    for f in prog.fifos:
        sides = [(f.producer, printed_dims_to_stream(prog, f))]
        sides += list(zip(f.consumers, f.dims_from_stream))
        for tile, dims in sides:
            if len(dims) > lim[tile.kind]:
                yield f"fifo {f.name} on {tile.name}", (f"{len(dims)} dimensions, a {tile.kind} "
                                                        f"tile BD has {lim[tile.kind]}")


@rule("dma_field_limits", AIEX_DIALECT + " (verifyStridesWraps: step/wrap bits per tile kind)",
      "Size 0|1 exceeds the [0:1023] range. (255 on core tiles) / Stride k exceeds the "
      "[1:1048576] range. (131072 mem tile, 8192 core tile) / Size 3 exceeds the [1:64] range.")
def _field_limits(prog, ctx):
    g = ctx.gen.dma_granularity_bytes.value * 8
    iter_max = ctx.gen.dma_iter_max.value
    for where, kind, s, t, bits in _patterns(prog):
        if s[3] > 1 and t[3] > 0 and s[3] - 1 > iter_max:      # 4th dim: the iteration fields
            yield where, f"iteration size {s[3] - 1} exceeds the [1:{iter_max}] range"
        wrap = (1 << ctx.gen.dma_wrap_bits.value[kind]) - 1
        step = 1 << ctx.gen.dma_step_bits.value[kind]
        linear = s[1] == 1 and s[2] == 1 and t[0] == 1
        hs0 = s[0] * bits // g
        if not linear and hs0 > wrap:
            yield where, f"size 0 = {hs0} words exceeds the [0:{wrap}] range ({kind} tile)"
        if s[1] > wrap:
            yield where, f"size 1 = {s[1]} exceeds the [0:{wrap}] range ({kind} tile)"
        for i in range(4):
            if s[i] > 1 and t[i] * bits // g > step:
                yield where, (f"stride {i} = {t[i] * bits // g} words exceeds the [1:{step}] "
                              f"range ({kind} tile)")


@rule("dma_stride_words", AIEX_DIALECT + " (verifyStridesWraps)",
      "Stride i is N elements * B bytes = X bytes, which is not divisible by 4. / Stride i must be "
      "a positive integer.")
def _stride_words(prog, ctx):
    unit = ctx.gen.dma_granularity_bytes.value
    for where, _, s, t, bits in _patterns(prog):
        for i in (i for i in range(4) if s[i] > 1):
            if t[i] < (0 if i == 3 else 1):                  # stride 3 may be 0: a repeat
                yield where, f"stride {i} = {t[i]} must be positive"
            elif not (i == 0 and t[i] == 1) and t[i] * bits % (8 * unit):
                yield where, f"stride {i} is {t[i]} x {bits}-bit elements, not a multiple of {unit} bytes"


@rule("dma_innermost_stride", AIE_OPS_TD + " (DMABDOp: 'the inner-most dimension's stride must "
      "be 1'); " + AIE_DIALECT, "For <32b width datatypes, inner-most dim stride must be 1")
def _innermost(prog, ctx):
    for where, _, s, t, _ in _patterns(prog):
        if s[0] > 1 and t[0] != 1:
            yield where, f"innermost stride {t[0]}, must be 1"


@rule("dma_alignment", AIEX_DIALECT + " (verifyStridesWraps); " + TASKS_TO_NPU,
      "Transfer sizes must be multiples of 4 bytes. / Offset must be aligned to 4 byte boundary.")
def _alignment(prog, ctx):
    g = ctx.gen.dma_granularity_bytes.value * 8
    for where, _, s, _, bits in _patterns(prog):
        if s[0] * bits % g:
            yield where, (f"innermost size {s[0]} x {bits}-bit elements is not a multiple of "
                          f"{g // 8} bytes")
    for t, bits, where in _tasks(prog):
        if t.offset * bits % g:
            yield where, f"offset {t.offset} elements x {bits} bits is not {g // 8}-byte aligned"


# --- capacity: memory, BDs, locks, channels -------------------------------------------------------
def _tiles(prog, kind):
    return [t for t in prog.tiles if t.kind == kind]


@rule("l1_memory", ASSIGN_BUFFERS + "; " + TARGET_MODEL + " getLocalMemorySize; " + AIE_OPS_TD
      + " (stack_size 0x400)", "allocated buffers exceeded available memory")
def _l1(prog, ctx):
    for t in _tiles(prog, "compute"):
        if ctx.u.memory[t.name] > ctx.l1_limit:
            yield t.name, _exceeded("L1 data memory (64 KiB minus stack; fifo buffers on both "
                                    "ends)", ctx.u.memory[t.name], ctx.l1_limit)


@rule("memtile_memory", ASSIGN_BUFFERS + "; " + TARGET_MODEL + " getMemTileSize",
      "allocated buffers exceeded available memory")
def _memtile(prog, ctx):
    cap = ctx.gen.memtile_bytes.value
    for t in _tiles(prog, "mem"):
        if ctx.u.memory[t.name] > cap:
            yield t.name, _exceeded("mem tile memory", ctx.u.memory[t.name], cap)


# usage table -> the Generation fields of its limit on (compute, mem, shim) tiles
_LIMITS = {"bds": ("core_bds", "memtile_bds", "shim_bds"),
           "locks": ("core_locks", "memtile_locks", "shim_locks"),
           "channels": ("core_dma_channels", "memtile_dma_channels", "shim_dma_channels")}


def limit(gen: Generation, table: str, kind: str):
    """The per-tile limit of a usage table ("bds", "locks", "channels") on a tile kind."""
    core, mem, shim = _LIMITS[table]
    return getattr(gen, {"compute": core, "mem": mem, "shim": shim}[kind]).value


def _over(prog, ctx, table: str, what: str, kinds=("compute", "mem", "shim")):
    for t in prog.tiles:
        n, cap = getattr(ctx.u, table)[t.name], limit(ctx.gen, table, t.kind)
        if t.kind in kinds and n > cap:
            yield t.name, _exceeded(what, n, cap)


@rule("bds_per_tile", AIE_DIALECT + " (HasValidBDs); " + TARGET_MODEL + " getNumBDs",
      "has more than N blocks / no space for this bd")
def _bds(prog, ctx):
    return _over(prog, ctx, "bds", "buffer descriptors", ("compute", "mem"))


@rule("shim_bds_in_flight", TARGET_MODEL + " getNumBDs; " + AIEX_DIALECT + " (NpuPushQueueOp)",
      "BD ID exceeds the maximum ID.")
def _shim_bds(prog, ctx):
    n = ctx.gen.shim_bds.value
    for col, k in ctx.u.shim_bds_in_flight.items():
        if k > n:
            yield f"shim column {col}", _exceeded("shim BDs in flight", k, n)


@rule("bds_per_channel", TARGET_MODEL + " isBdChannelAccessible; " + STATEFUL
      + " (DMAChannelAnalysis: channels in order)",
      "no space for this bd (mem tile: even channels BD 0-23, odd channels BD 24-47)")
def _bds_per_channel(prog, ctx):
    half = ctx.gen.memtile_bds_per_parity.value
    for t in _tiles(prog, "mem"):
        used = [0, 0]
        nxt = {"MM2S": 0, "S2MM": 0}
        for f in prog.fifos:
            for end in f.endpoints:
                if end != t:
                    continue
                d = "MM2S" if end == f.producer else "S2MM"
                used[nxt[d] % 2] += endpoint_bds(prog, f, t)
                nxt[d] += 1
        for parity, n in enumerate(used):
            if n > half:
                yield t.name, _exceeded(f"BDs of the {('even', 'odd')[parity]} channels", n, half)


@rule("locks_per_tile", AIE_DIALECT + " (LockOp::verify); " + TARGET_MODEL + " getNumLocks",
      "lock assigned invalid id (maximum is N-1)")
def _locks(prog, ctx):
    return _over(prog, ctx, "locks", "locks")


@rule("lock_values", AIEX_DIALECT + " (SetLockOp::verify); " + TARGET_MODEL + " getMaxLockValue; "
      + STATEFUL + " (createObjectFifoLocks: producer lock = depth x repeat_count)",
      "Lock value exceeds the maximum value of 63")
def _lock_values(prog, ctx):
    hi = ctx.gen.lock_value_max.value
    for f in prog.fifos:
        v = f.depth * prog.repeat_count(f.name)
        if v > hi:
            yield f"fifo {f.name}", f"producer lock initial value {v} (depth x repeat) exceeds {hi}"


@rule("dma_channels", STATEFUL + " (getDMAChannelIndex); " + f"{MLIR_AIE} lib/Dialect/AIE/IR/"
      "AIETargetModel.cpp (index version) getNum{Source,Dest}SwitchboxConnections(DMA)",
      "number of input DMA channel exceeded! / number of output DMA channel exceeded!")
def _channels(prog, ctx):
    for t in prog.tiles:
        cin, cout = limit(ctx.gen, "channels", t.kind)
        uin, uout = ctx.u.channels[t.name]
        if uin > cin:
            yield t.name, _exceeded("DMA S2MM (input) channels", uin, cin)
        if uout > cout:
            yield t.name, _exceeded("DMA MM2S (output) channels", uout, cout)
    for task, _, where in _tasks(prog):
        n = limit(ctx.gen, "channels", "shim")[task.direction == "MM2S"]
        if not 0 <= task.channel < n:
            yield where, f"{task.direction} channel {task.channel} outside 0..{n - 1}"


# --- constructs only some tiles support -------------------------------------------------------------
@rule("padding_memtile_mm2s", TASKS_TO_NPU + "; " + AIEX_DIALECT + " (NpuWriteBdOp::verify); "
      + AIE_DIALECT + " (DMABDOp::verify)",
      "Padding is only supported by memtile dma bds. / ShimTile doesn't support zero padding. / "
      "Inner-most padding-before count must result in padding in 32-bit words.")
def _padding(prog, ctx):
    for t, _, where in _tasks(prog):
        if any(t.pad_after):
            yield where, f"zero padding {t.pad_after} on a shim BD; upstream pads on mem-tile MM2S only"
    for f in prog.fifos:
        if not f.pad_dims:
            continue
        where = f"fifo {f.name}"
        if f.producer.kind != "mem":
            yield where, f"padDimensions {f.pad_dims} on a {f.producer.kind} producer; only mem-tile MM2S BDs pad"
        if len(f.pad_dims) != len(f.dims_to_stream):
            yield where, (f"{len(f.pad_dims)} padding dims for {len(f.dims_to_stream)} dims "
                          "(Mismatch number of dimensions between padding(s) and wrap(s) and stride(s).)")
        bits = ir.DTYPE_BITS[f.elem.dtype]
        lo, hi = f.pad_dims[-1]
        if lo * bits % 32 or hi * bits % 32:
            yield where, f"innermost padding ({lo}, {hi}) x {bits}-bit elements is not whole 32-bit words"


@rule("repeat_count_not_on_shim", AIE_DIALECT + " (ObjectFifoCreateOp::verify)",
      "`repeat_count` unavailable for shim tiles")
def _repeat_shim(prog, ctx):
    for f in prog.fifos:
        if prog.repeat_count(f.name) > 1 and f.producer.kind == "shim":
            yield f"fifo {f.name}", f"repeat_count {prog.repeat_count(f.name)} on a shim producer"


@rule("link_on_memtile", AIE_DIALECT + " (ObjectFifoLinkOp::verify)",
      "ObjectFifoLinkOp join and distribute are unavailable on compute or shim tiles")
def _link_tile(prog, ctx):
    for ln in prog.links:
        shared = {prog.fifo(n).producer for n in ln.dsts}
        shared &= {c for n in ln.srcs for c in prog.fifo(n).consumers}
        kinds = {t.kind for t in shared}
        if not shared:
            yield f"link {list(ln.srcs)} -> {list(ln.dsts)}", "no shared tile (link point)"
        elif ln.kind != "forward" and kinds != {"mem"}:
            yield f"link {list(ln.srcs)} -> {list(ln.dsts)}", f"{ln.kind} on a {sorted(kinds)} tile"


# --- core kernels ------------------------------------------------------------------------------------
@rule("link_with_objects", LINK_FILES + "; " + AIE_OPS_TD + " (func-level link_with)",
      "func 'f' has link_with but is never called from any core; its .o file will not be linked")
def _link_with(prog, ctx):
    called = {op.kernel for c in prog.cores for op in walk(c.body) if isinstance(op, ir.Call)}
    declared = {k.symbol: k for k in prog.kernels}
    for sym in sorted(called - set(declared)):
        yield f"call {sym}", "calls a kernel with no func.func declaration (no link_with object)"
    for k in prog.kernels:
        if not k.object_file.endswith(".o"):
            yield f"kernel {k.symbol}", f"link_with {k.object_file!r} is not an object file"
        if k.symbol not in called:
            yield f"kernel {k.symbol}", "declared with link_with but never called from any core"


@rule("kernel_signatures", "torch_xdna/kernels/aie KernelSpec table (the C++ extern \"C\" "
      "signatures); " + LINK_FILES, "(link time) undefined or mismatched symbol")
def _signatures(prog, ctx):
    if ctx.contract is None:
        return
    for msg in ctx.contract(prog):
        yield "kernels", msg


# --- entry points ------------------------------------------------------------------------------------
def check(prog: ir.ArrayProgram, gen: Generation, names: Iterable[str] | None = None, *,
          l1_limit: int | None = None, u: Usage | None = None,
          contract: Contract | None = None) -> list[Violation]:
    """Violations of the named rules (all when None); `l1_limit` defaults to upstream's
    (L1 size minus aie.core's default stack)."""
    ctx = Context(gen, u or usage(prog, repeats=True),
                  gen.l1_bytes.value - gen.core_stack_bytes.value if l1_limit is None else l1_limit,
                  contract)
    out = []
    for name in (RULES if names is None else names):
        r = RULES[name]
        out += [Violation(name, where, msg, r.citation) for where, msg in r.check(prog, ctx)]
    return out


def verify(prog: ir.ArrayProgram, gen: Generation | None = None,
           contract: Contract | None = None) -> list[Violation]:
    """Every upstream rule `prog` breaks (empty: aiecc's verifiers accept it, as far as these
    rules go; docs/hardware.md lists what is not checked)."""
    return check(prog, gen or get_generation(prog.generation), contract=contract)

