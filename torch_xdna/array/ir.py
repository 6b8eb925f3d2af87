"""The array-level design IR: what one design is on the NPU, as frozen pure data.

A design's plan (kernels/) says how an op is tiled; this IR says what the array executes: placed
tiles, object FIFOs between them (with their buffer depth and DMA access patterns), mem-tile
split/join links, the program of each compute core, the external core kernels it calls, and the
runtime sequence (shim DMA tasks) the host issues per launch. array/mlir.py prints it as an
MLIR-AIE module; the instruction-stream encoder (array/txn.py) turns its runtime sequence into
NPU transaction words; the transaction-level simulator (runtime/sim/txn*) executes both.

Types (all frozen dataclasses; only torch_xdna.hw is imported):
  ArrayProgram   the whole design: generation name, tiles, fifos, links, buffers, kernels, cores,
                 sequence.  .tile(col,row), .fifo(name), .kernel(sym), .buffer(name)
  Tile           (col, row, kind)  kind in TILE_KINDS: "shim" | "mem" | "compute"; .name
  TensorType     (shape, dtype)    dtype in DTYPE_BITS ("bf16","f32","i8","i16","i32","u8","i4");
                 .numel, .nbytes
  TileBuffer     a static buffer on one tile (L1 accumulator / scratch / runtime parameters):
                 (name, tile, type, level "L1"|"L2", rtp: bool)
  HostArg        one launch argument (L3, DDR): (name, type); flat tensors, offsets in elements
  ScalarArg      one launch-time scalar (patched per launch): (name, dtype)
  ObjectFifo     (name, producer Tile, consumers tuple[Tile], depth, elem TensorType,
                 dims_to_stream ((size, stride), ...) producer side, outermost first, <= 4-D;
                 dims_from_stream: per consumer, same form, () = contiguous,
                 pad_dims ((before, after), ...) per dims_to_stream dim: zeros the mem-tile
                 producer's MM2S adds (mlir-aie padDimensions))
  FifoLink       mem-tile split/join: (srcs, dsts, src_offsets, dst_offsets, emits) fifo names,
                 offsets in elements of the single (joined/split) fifo; 1:1 = plain forward;
                 emits > 1 (split/forward): each source element goes out as `emits` elements
                 per destination (a held block re-streamed, e.g. GEMM B reused by M sub-blocks)
  CoreBody       (tile, body tuple[CoreOp], link_with object file names)
    CoreOp = Loop(count, body) | Acquire(fifo, port, n) | Release(fifo, port, n)
      (count: an int, FOREVER, or ScalarRef(rtp buffer): a trip count the core reads from a
      runtime parameter when the loop starts, written per launch by an RtpWrite)
           | Call(kernel, args tuple[KernelArg])
    KernelArg = FifoElem(fifo, index) | BufferRef(name) | Const(value, dtype) | ScalarRef(name)
      (ScalarRef names a launch scalar, or an rtp TileBuffer whose element 0 the core reads)
  KernelDecl     (symbol, object_file, arg_types: tuple[TensorType | str scalar dtype])
  RuntimeSequence(args tuple[HostArg], scalars tuple[ScalarArg], ops tuple[SeqOp])
    SeqOp = DmaTask(...)  one shim BD + task-queue push: fifo (the shim fifo it feeds/drains),
              arg (HostArg name), offset, sizes, strides (4-D, outermost first, elements of the
              arg's dtype; innermost stride 1), direction "MM2S"|"S2MM", channel, column, bd_id,
              issue_token, repeat (task-queue repeat count, 1 = once), pad_after (zeros per
              dim for edge tiles). Consecutive tasks on one fifo fill its element stream in
              order (several host args may be packed into one fifo element that way).
          | Await(task ids)      wait for the tokens of S2MM/MM2S tasks (sync/TCT)
          | Free(task ids)       release BDs of tasks that issued no token (after a later await)
          | RtpWrite(buffer, index, value int|float|ScalarRef)  launch-time scalar patch

Nothing here is callable on data: core kernel references live in kernels/ under the symbol name.
A launch may be several programs run in order (kernels/lower): host args are matched by name
across them; notes carry "launch_args" / "scratch_args" / "host_layout" where they apply.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Union

TILE_KINDS = ("shim", "mem", "compute")
LEVELS = ("L1", "L2", "L3")
DTYPE_BITS = {"bf16": 16, "f32": 32, "i8": 8, "i16": 16, "i32": 32, "u8": 8, "i4": 4, "u32": 32,
              "f16": 16, "i64": 64}
DIRECTIONS = ("MM2S", "S2MM")
PORTS = ("consume", "produce")
FOREVER = None                       # Loop.count of a core's outer loop (mlir-aie: run forever)


@dataclass(frozen=True, order=True)
class Tile:
    """One placed tile. Rows: 0 shim, 1 mem tile, 2.. compute (AIE2/AIE2P NPU layout)."""

    col: int
    row: int
    kind: str

    def __post_init__(self):
        if self.kind not in TILE_KINDS:
            raise ValueError(f"Tile kind {self.kind!r} unknown; use one of {TILE_KINDS}")

    @property
    def name(self) -> str:
        prefix = {"shim": "shim", "mem": "mem", "compute": "core"}[self.kind]
        return f"{prefix}_{self.col}_{self.row}"


@dataclass(frozen=True)
class TensorType:
    """A dense tensor of one element type (a memref in MLIR)."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        if self.dtype not in DTYPE_BITS:
            raise ValueError(f"TensorType dtype {self.dtype!r} unknown; use one of {tuple(DTYPE_BITS)}")
        if any(int(s) <= 0 for s in self.shape):
            raise ValueError(f"TensorType shape {self.shape} must be positive")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return (self.numel * DTYPE_BITS[self.dtype] + 7) // 8


@dataclass(frozen=True)
class TileBuffer:
    """A static (non-FIFO) buffer in one tile's memory (L1 or mem tile), `rtp` marking a
    runtime-parameter buffer; not a host BO (that is runtime/buffer.py's Buffer)."""

    name: str
    tile: Tile
    type: TensorType
    level: str = "L1"
    rtp: bool = False


@dataclass(frozen=True)
class HostArg:
    """One launch argument: a flat host buffer in DDR (L3)."""

    name: str
    type: TensorType


@dataclass(frozen=True)
class ScalarArg:
    name: str
    dtype: str = "i32"


Dims = tuple[tuple[int, int], ...]   # ((size, stride), ...) outermost first


@dataclass(frozen=True)
class ObjectFifo:
    """A producer -> consumers stream of `depth` buffers of `elem` (depth 2 = double buffer)."""

    name: str
    producer: Tile
    consumers: tuple[Tile, ...]
    depth: int
    elem: TensorType
    dims_to_stream: Dims = ()
    dims_from_stream: tuple[Dims, ...] = ()
    # zero padding the producer's DMA adds, ((before, after), ...) per dims_to_stream dim
    # (mlir-aie objectfifo `padDimensions`: only a mem-tile producer, its MM2S BDs, pads)
    pad_dims: tuple[tuple[int, int], ...] = ()

    @property
    def walked(self) -> int:
        """Elements the producer's walk reads (dims_to_stream, else the whole element); with
        pad_dims the element is the walk plus its zero padding."""
        n = 1
        for size, _ in self.dims_to_stream:
            n *= size
        return n if self.dims_to_stream else self.elem.numel

    @property
    def endpoints(self) -> tuple[Tile, ...]:
        return (self.producer,) + self.consumers


@dataclass(frozen=True)
class FifoLink:
    """Mem-tile data movement: split one fifo into many (offsets into the source element),
    join many into one (offsets into the destination element), or forward 1:1."""

    srcs: tuple[str, ...]
    dsts: tuple[str, ...]
    src_offsets: tuple[int, ...] = ()
    dst_offsets: tuple[int, ...] = ()
    # a split / forward that re-streams its held source element: each destination's
    # dims_to_stream walks it (a size-n stride-0 dim repeats it) as `emits` elements, the
    # source buffer held until the last is sent (mlir-aie: multi-dim mem-tile BDs with repeat)
    emits: int = 1

    @property
    def kind(self) -> str:
        if len(self.srcs) > 1:
            return "join"
        return "split" if len(self.dsts) > 1 else "forward"


# --- core programs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class FifoElem:
    """The `index`-th element acquired from `fifo` by the enclosing core."""

    fifo: str
    index: int = 0


@dataclass(frozen=True)
class BufferRef:
    name: str


@dataclass(frozen=True)
class Const:
    value: Union[int, float]
    dtype: str = "i32"


@dataclass(frozen=True)
class ScalarRef:
    """A launch-time scalar (RuntimeSequence.scalars) or one read from an RTP buffer."""

    name: str


KernelArg = Union[FifoElem, BufferRef, Const, ScalarRef]


@dataclass(frozen=True)
class Acquire:
    fifo: str
    port: str          # "consume" | "produce"
    n: int = 1


@dataclass(frozen=True)
class Release:
    fifo: str
    port: str
    n: int = 1


@dataclass(frozen=True)
class Call:
    kernel: str
    args: tuple[KernelArg, ...] = ()


@dataclass(frozen=True)
class Loop:
    """A counted core loop. A ScalarRef count is a runtime trip count (slot 0 of an RTP buffer,
    written by the launch's RtpWrite): mlir-aie keeps such a loop as an scf.for whose bound is a
    memref.load, and its dynamic objectFIFO lowering (aiecc's default) picks each iteration's
    buffer from a runtime counter instead of unrolling by the FIFO depth
    (test/objectFifo-stateful-transform/dynamic_lowering/dynamic_lowering_test.mlir
    @ ae6577cb2e67d9a9c12117204baae59b47542808)."""

    count: Union[int, None, "ScalarRef"]      # None = FOREVER
    body: tuple["CoreOp", ...] = ()

    def trips(self, rtp: dict[str, int]) -> int | None:
        """The trip count at a launch whose RTP slot values are `rtp` (None: forever)."""
        if isinstance(self.count, ScalarRef):
            if self.count.name not in rtp:
                raise KeyError(f"loop bound {self.count.name!r} has no RtpWrite in the launch")
            return int(rtp[self.count.name])
        return self.count


CoreOp = Union[Loop, Acquire, Release, Call]


@dataclass(frozen=True)
class CoreBody:
    tile: Tile
    body: tuple[CoreOp, ...]
    link_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class KernelDecl:
    """An external core kernel (C++ in kernels/aie/, compiled to `object_file`)."""

    symbol: str
    object_file: str
    arg_types: tuple[Union[TensorType, str], ...]


# --- runtime sequence -------------------------------------------------------------------------
@dataclass(frozen=True)
class DmaTask:
    """One shim DMA buffer descriptor pushed to a channel's task queue."""

    id: int                       # unique within the sequence
    fifo: str                     # shim-side object FIFO (its symbol names the channel)
    arg: str                      # HostArg name
    offset: int                   # elements
    sizes: tuple[int, ...]        # up to 4, outermost first
    strides: tuple[int, ...]      # same length, elements; innermost 1
    direction: str                # "MM2S" (DDR -> array) | "S2MM" (array -> DDR)
    channel: int
    column: int
    bd_id: int
    issue_token: bool = False
    repeat: int = 1
    pad_after: tuple[int, ...] = ()   # per dim (same length as sizes), see below

    # pad_after (edge tiles): after the run of dimension d the stream carries pad_after[d]
    # units of zeros (a unit = the full extent of the dims inside d, incl. their padding), as
    # the AIE-ML mem tile DMA's zero padding does. A size may be 0 when its pad is > 0 (an
    # all-padding tail). For S2MM the padded positions of the stream are dropped, not written.

    @property
    def stream_elements(self) -> int:
        """Elements this task puts on (MM2S) or takes off (S2MM) the stream, incl. padding."""
        pads = self.pad_after or (0,) * len(self.sizes)
        n = 1
        for s, p in zip(reversed(self.sizes), reversed(pads)):
            n = n * s + p * n
        return n * self.repeat

    @property
    def elements(self) -> int:
        return math.prod(self.sizes) * self.repeat


@dataclass(frozen=True)
class Await:
    tasks: tuple[int, ...]


@dataclass(frozen=True)
class Free:
    tasks: tuple[int, ...]


@dataclass(frozen=True)
class RtpWrite:
    buffer: str
    index: int
    value: Union[int, float, ScalarRef]


SeqOp = Union[DmaTask, Await, Free, RtpWrite]


@dataclass(frozen=True)
class RuntimeSequence:
    args: tuple[HostArg, ...]
    ops: tuple[SeqOp, ...] = ()
    scalars: tuple[ScalarArg, ...] = ()

    @property
    def tasks(self) -> tuple[DmaTask, ...]:
        return tuple(op for op in self.ops if isinstance(op, DmaTask))

    def rtp_values(self) -> dict[str, int | float]:
        """Slot 0 of every RTP buffer this launch writes with a constant (runtime loop bounds
        and kernel parameters, as the core reads them)."""
        return {op.buffer: op.value for op in self.ops
                if isinstance(op, RtpWrite) and op.index == 0 and not isinstance(op.value, ScalarRef)}


@dataclass(frozen=True)
class ArrayProgram:
    """One design on the array: static configuration plus its per-launch runtime sequence."""

    name: str
    generation: str                       # hw generation name ("npu4", ...)
    tiles: tuple[Tile, ...]
    fifos: tuple[ObjectFifo, ...]
    links: tuple[FifoLink, ...] = ()
    buffers: tuple[TileBuffer, ...] = ()
    kernels: tuple[KernelDecl, ...] = ()
    cores: tuple[CoreBody, ...] = ()
    sequence: RuntimeSequence = RuntimeSequence(())
    notes: tuple[tuple[str, object], ...] = field(default=())

    def _find(self, items, match, what: str):
        """The first of `items` that `match`es; KeyError naming the program and `what`."""
        hit = next((x for x in items if match(x)), None)
        if hit is None:
            raise KeyError(f"{self.name}: no {what}")
        return hit

    def tile(self, col: int, row: int) -> Tile:
        return self._find(self.tiles, lambda t: (t.col, t.row) == (col, row),
                          f"tile at column {col} row {row}")

    def fifo(self, name: str) -> ObjectFifo:
        return self._find(self.fifos, lambda f: f.name == name, f"object fifo named {name!r}")

    def kernel(self, symbol: str) -> KernelDecl:
        return self._find(self.kernels, lambda k: k.symbol == symbol,
                          f"kernel declared with symbol {symbol!r}")

    def buffer(self, name: str) -> TileBuffer:
        return self._find(self.buffers, lambda b: b.name == name, f"buffer named {name!r}")

    def core(self, tile: Tile) -> CoreBody:
        return self._find(self.cores, lambda c: c.tile == tile, f"core program on {tile.name}")

    def repeat_count(self, fifo: str) -> int:
        """How often each element of `fifo` is sent (mlir-aie's objectfifo `repeat_count`,
        AIEOps.td): a link re-sending its held source element `emits` times to each
        destination; 1 otherwise."""
        ln = self.link_of(fifo)
        return ln.emits if ln is not None and fifo in ln.dsts else 1

    def link_of(self, fifo: str) -> FifoLink | None:
        """The first link `fifo` takes part in (as source or destination), or None."""
        return next((ln for ln in self.links if fifo in ln.srcs or fifo in ln.dsts), None)
