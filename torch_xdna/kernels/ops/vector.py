"""Vector-unit designs: elementwise chains, reductions, softmax, norms, embedding gather.

These stream their operands through the array once: DRAM bytes are the operands plus the result,
compute is element-ops over the vector lanes of the cores used. Each op's cost is the sourced
per-vector cycle count of hw/vector_costs.py (derived from the upstream AIE2P kernels), bounded
below by the core's load/store rate at the design's element widths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import AIE2P, Generation
from torch_xdna.hw.vector_costs import VECTOR_OP_CYCLES, cycles_per_elem
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design, ceil_div, numel
from torch_xdna.kernels.capacity import DmaTransfer, check_plan, lanes, need
from torch_xdna.runtime.plan import Plan

def _p(op: str) -> float:
    """The op's cost in vector passes (cycles per 16 elements, the fp32-lane unit other
    tables use) at bf16 operands, from hw/vector_costs.py: one source for both units."""
    cost = VECTOR_OP_CYCLES[op].value
    return 16 * cycles_per_elem(cost, 16, 16, AIE2P.vector_load_bits.value,
                                AIE2P.vector_store_bits.value)


# op -> (reference on fp32/int values, vector passes per element: _p, hw/vector_costs.py)
def _binary(fn: Callable) -> Callable:
    return lambda xs, **kw: fn(xs[0], xs[1])


def _softmax(xs, dim, **kw):
    return torch.softmax(xs[0], dim)


def _log_softmax(xs, dim, **kw):
    return torch.log_softmax(xs[0], dim)


def _layer_norm(xs, eps, has_weight, has_bias, norm_dims, **kw):
    x = xs[0]
    dims = tuple(range(-norm_dims, 0))
    # the centred x is computed once and the rest runs in place on it: the same operations in
    # the same order as (x - mean) ** 2 ... (x - mean) * rsqrt * w + b (pow 2 is a square), so
    # the same values, without four temporaries (sim speed)
    mean = x.mean(dims, keepdim=True)
    y = x - mean
    var = (y * y).mean(dims, keepdim=True)
    y.mul_(torch.rsqrt(var + eps))
    i = 1
    if has_weight:
        y = y.mul_(xs[i]) if xs[i].shape == y.shape[-xs[i].dim():] else y * xs[i]
        i += 1
    if has_bias:
        y = y.add_(xs[i]) if xs[i].shape == y.shape[-xs[i].dim():] else y + xs[i]
    return y


def _rms_norm(xs, eps, has_weight, weight_offset=0.0, **kw):
    x = xs[0]
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    if has_weight:
        y = y * (xs[1] + weight_offset)
    return y


def _reduce(fn):
    def run(xs, dims, keepdim, **kw):
        x = xs[0]
        if not dims:
            return fn(x, dim=tuple(range(x.dim())), keepdim=keepdim) if x.dim() else x
        return fn(x, dim=dims, keepdim=keepdim)
    return run


OPS: dict[str, tuple[Callable, float]] = {
    "add": (lambda xs, alpha=1.0, **kw: xs[0] + alpha * xs[1] if alpha != 1.0 else xs[0] + xs[1], _p("add")),
    "sub": (lambda xs, alpha=1.0, **kw: xs[0] - alpha * xs[1] if alpha != 1.0 else xs[0] - xs[1], _p("sub")),
    "mul": (_binary(torch.mul), _p("mul")),
    "div": (_binary(torch.div), _p("div")),
    "maximum": (_binary(torch.maximum), _p("maximum")),
    "minimum": (_binary(torch.minimum), _p("minimum")),
    "neg": (lambda xs, **kw: -xs[0], _p("neg")),
    "relu": (lambda xs, **kw: apply_epilogue("relu", xs[0]), _p("relu")),
    "gelu": (lambda xs, **kw: apply_epilogue("gelu", xs[0]), _p("gelu")),
    "gelu_tanh": (lambda xs, **kw: apply_epilogue("gelu_tanh", xs[0]), _p("gelu_tanh")),
    "silu": (lambda xs, **kw: apply_epilogue("silu", xs[0]), _p("silu")),
    "sigmoid": (lambda xs, **kw: torch.sigmoid(xs[0]), _p("sigmoid")),
    "tanh": (lambda xs, **kw: torch.tanh(xs[0]), _p("tanh")),
    "exp": (lambda xs, **kw: torch.exp(xs[0]), _p("exp")),
    "rsqrt": (lambda xs, **kw: torch.rsqrt(xs[0]), _p("rsqrt")),
    "sqrt": (lambda xs, **kw: torch.sqrt(xs[0]), _p("sqrt")),
    "softmax": (_softmax, _p("softmax")),
    "log_softmax": (_log_softmax, _p("log_softmax")),
    "layer_norm": (_layer_norm, _p("layer_norm")),
    "rms_norm": (_rms_norm, _p("rms_norm")),
    "sum": (_reduce(torch.sum), _p("sum")),
    "mean": (_reduce(torch.mean), _p("mean")),
    "amax": (_reduce(torch.amax), _p("amax")),
    "copy": (lambda xs, **kw: xs[0], _p("copy")),
    "where": (lambda xs, **kw: torch.where(xs[0].bool(), xs[1], xs[2]), _p("where")),
    # comparisons and predicates (bool out): a compare/select per element, no rounding
    "eq": (_binary(torch.eq), _p("eq")),
    "ne": (_binary(torch.ne), _p("ne")),
    "lt": (_binary(torch.lt), _p("lt")),
    "le": (_binary(torch.le), _p("le")),
    "gt": (_binary(torch.gt), _p("gt")),
    "ge": (_binary(torch.ge), _p("ge")),
    "bitwise_and": (_binary(torch.bitwise_and), _p("bitwise_and")),
    "bitwise_or": (_binary(torch.bitwise_or), _p("bitwise_or")),
    "bitwise_xor": (_binary(torch.bitwise_xor), _p("bitwise_xor")),
    "bitwise_not": (lambda xs, **kw: torch.bitwise_not(xs[0]), _p("bitwise_not")),
    "logical_and": (_binary(torch.logical_and), _p("logical_and")),
    "logical_or": (_binary(torch.logical_or), _p("logical_or")),
    "logical_xor": (_binary(torch.logical_xor), _p("logical_xor")),
    "logical_not": (lambda xs, **kw: torch.logical_not(xs[0]), _p("logical_not")),
    "isnan": (lambda xs, **kw: torch.isnan(xs[0]), _p("isnan")),
    "isinf": (lambda xs, **kw: torch.isinf(xs[0]), _p("isinf")),
    "isneginf": (lambda xs, **kw: torch.isneginf(xs[0]), _p("isneginf")),
    "isposinf": (lambda xs, **kw: torch.isposinf(xs[0]), _p("isposinf")),
    "isfinite": (lambda xs, **kw: torch.isfinite(xs[0]), _p("isfinite")),
    "all": (_reduce(torch.all), _p("all")),
    "any": (_reduce(torch.any), _p("any")),
    "abs": (lambda xs, **kw: torch.abs(xs[0]), _p("abs")),
    "clamp": (lambda xs, min=None, max=None, **kw: torch.clamp(xs[0], min, max), _p("clamp")),
    "square": (lambda xs, **kw: xs[0] * xs[0], _p("square")),
    # x ** p as exp2(p * log2 x): two transcendentals and a multiply
    "pow": (lambda xs, exponent, **kw: torch.pow(xs[0], exponent), _p("pow")),
    "reciprocal": (lambda xs, **kw: torch.reciprocal(xs[0]), _p("reciprocal")),
    "log": (lambda xs, **kw: torch.log(xs[0]), _p("log")),
    "erf": (lambda xs, **kw: torch.erf(xs[0]), _p("erf")),
    # sin/cos: range reduction on the fp32 operand, then a polynomial (see FP32_OPERAND)
    "sin": (lambda xs, **kw: torch.sin(xs[0]), _p("sin")),
    "cos": (lambda xs, **kw: torch.cos(xs[0]), _p("cos")),
    "cumsum": (lambda xs, dim, **kw: torch.cumsum(xs[0], dim), _p("cumsum")),
}
ROW_OPS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "cumsum")
FLAT_CHUNK_MAX = 2048         # elements per core per call for elementwise ops (fits L1 x 4 operands)
# ops whose arithmetic is only adds, so fp32 operands stay exact (accumulator path)
EXACT_FP32 = {"add", "sub", "neg", "relu", "maximum", "minimum", "copy", "where", "sum", "mean", "amax",
              # compares, selects and sign/bit operations: no arithmetic to round
              "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
              "logical_not", "isnan", "isinf", "isneginf", "isposinf", "isfinite", "all", "any",
              "abs", "clamp", "cumsum"}
# ops that keep the fp32 operand though they compute: sin/cos reduce the angle modulo 2*pi on the
# fp32 accumulator path first (a bf16 angle is off by up to 2^-9 * |x| rad, which ruins RoPE at
# large positions); the polynomial that follows is exact enough at fp32
FP32_OPERAND = {"sin", "cos"}


@dataclass(frozen=True)
class VectorDesign(Design):
    """One vector-unit op (or a fused chain, see `chain`) over fixed shapes and dtypes."""

    op: str
    in_shapes: tuple                 # shapes as the kernel reads them (broadcast already resolved)
    in_dtypes: tuple
    out_shape: tuple
    out_dtype: torch.dtype
    params: tuple = ()               # sorted (name, value) static parameters
    kind = "vector"

    @property
    def name(self) -> str:
        return self.op

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        fn, _ = OPS[self.op]
        exact = self.op in EXACT_FP32 or self.op in FP32_OPERAND
        xs = []
        for x in inputs:
            if x.dtype in numerics.FLOAT_DTYPES:
                xs.append(x.float() if exact else numerics.operand(x))
            elif x.dtype == torch.bool or self.out_dtype.is_floating_point is False:
                xs.append(x)
            else:
                xs.append(x.float() if self.out_dtype.is_floating_point else x)
        kw = dict(self.params)
        kw.update(scalars)
        numerics.store(fn(xs, **kw), outputs[0])

    def plan(self, gen: Generation) -> Plan:
        """Stream the operands through up to every core in chunks (whole rows for row ops)."""
        passes = self._passes()
        label = f"{self.op} {self.in_shapes}->{self.out_shape}"
        n_out = numel(self.out_shape)
        n_in = max([numel(s) for s in self.in_shapes] + [n_out])
        read = sum(numel(s) * d.itemsize for s, d in zip(self.in_shapes, self.in_dtypes))
        write = n_out * self.out_dtype.itemsize
        main_b = self.in_dtypes[0].itemsize if self.in_dtypes else 4
        out_b = self.out_dtype.itemsize
        if self._is_row_op():
            work, n_units, l1, double = self._row_tiling(gen, label, main_b, out_b, n_in)
        else:
            work, double = self._flat_tiling(gen, n_in), True
            l1 = 2 * work * (sum(d.itemsize for d in self.in_dtypes) + out_b)
            n_units = ceil_div(n_in, work) if n_in else 1
        streams = max(1, len(self.in_shapes))
        cores = max(1, min(gen.cores, n_units))
        cols = min(gen.columns.value, ceil_div(cores, gen.core_rows.value))
        per_core = ceil_div(n_units, cores)
        cycles = per_core * (work * self._cycles_per_elem(gen) + gen.kernel_call_cycles.value) \
            if n_in else 0.0
        rows_per_col = ceil_div(cores, cols)
        bufs = 2 if double else 1
        memtile = bufs * rows_per_col * work * (sum(d.itemsize for d in self.in_dtypes) + out_b)
        tasks = streams + 1
        plan = Plan(
            design="vector", dtype="fp32-vec", columns=cols, cores=cores, tile=(work,),
            l1_bytes=int(l1), memtile_bytes=int(min(memtile, gen.memtile_bytes.value)),
            core_bds=bufs * (streams + 1), memtile_bds=bufs * 2 * (streams + 1),
            core_locks=bufs * (streams + 1), shim_tasks=min(gen.shim_task_queue_depth.value, tasks),
            double_buffered=double, dram_read_bytes=read, dram_write_bytes=write,
            vector_elems=int(passes * n_in), compute_cycles=cycles,
            dma_shapes=(DmaTransfer("operand chunks", (n_units, work), (work, 1)),),
            notes={"memtile_locks": bufs * 2 * (streams + 1),
                   # operands beyond the channel count share a channel's BD chain
                   "core_dma": (min(streams, gen.core_dma_channels.value[0]), 1),
                   "memtile_dma": (min(streams, 2) + rows_per_col, min(streams, 2) + 1),
                   "shim_dma": (min(streams, gen.shim_dma_channels.value[0]), 1),
                   "units": n_units, "rows_per_unit": work // max(1, self._row_len()),
                   "fill_s": (cycles / max(1, per_core)) / gen.core_clock_hz.value})
        return check_plan(gen, label, plan)

    def _passes(self) -> float:
        """Vector passes per element (the op table's cost column); subclasses own other tables."""
        return OPS[self.op][1]

    def _cycles_per_elem(self, gen: Generation) -> float:
        """Core cycles per element: the op's sourced per-vector cost (hw/vector_costs.py) at
        this design's operand/result widths in L1 (loads at vector_load_bits, stores at
        vector_store_bits per cycle); ops of other tables (vector_ops.TABLE) keep their passes
        over the fp32 lanes."""
        cost = VECTOR_OP_CYCLES.get(self.op) if self.op in OPS else None
        if cost is None:
            return self._passes() / lanes(gen, 32)
        in_bits = 8 * max((d.itemsize for d in self.in_dtypes), default=4)
        return cycles_per_elem(cost.value, in_bits, 8 * self.out_dtype.itemsize,
                               gen.vector_load_bits.value, gen.vector_store_bits.value)

    def _is_row_op(self) -> bool:
        """True when a whole row must sit in one core's L1 (softmax, norms, scans)."""
        return self.op in ROW_OPS

    def _row_len(self) -> int:
        if not self._is_row_op() or not self.in_shapes or not self.in_shapes[0]:
            return 1
        nd = dict(self.params).get("norm_dims", 1) if self.op == "layer_norm" else 1
        return numel(self.in_shapes[0][-nd:])

    def _row_streams(self, in_b: int, out_b: int) -> tuple[int, int, int]:
        """(bytes per row element streamed in, streamed out, resident parameter bytes): the
        first input streams, the others (norm weights) stay resident."""
        params = sum(numel(s) * d.itemsize for s, d in zip(self.in_shapes[1:], self.in_dtypes[1:]))
        return in_b, out_b, params

    def _row_tiling(self, gen: Generation, label: str, in_b: int, out_b: int, n_in: int):
        """(elements per unit, units, L1 bytes, double-buffered) for row ops: a row must sit in
        one core's L1 (input, an fp32 working row unless the input is fp32, output, and the
        resident per-row parameters such as norm weights)."""
        row = max(1, self._row_len())      # an empty row (softmax over a 0-size dim): no work
        in_b, out_b, params = self._row_streams(in_b, out_b)
        working = 0 if in_b == 4 else 4 * row
        n_rows = max(1, n_in // max(1, row))
        for double in (True, False):
            bufs = 2 if double else 1
            per_row = bufs * row * (in_b + out_b)
            l1 = per_row + working + params
            if l1 <= gen.l1_usable:
                rows_per_unit = max(1, min(ceil_div(n_rows, gen.cores),
                                           (gen.l1_usable - params - working) // per_row))
                l1 = rows_per_unit * per_row + working + params
                return rows_per_unit * row, ceil_div(n_rows, rows_per_unit), l1, double
        need(label, f"L1 data memory per core (one {self.op} row of {row} elements)", l1,
             gen.l1_usable, "a row must fit one core's L1: split the row (e.g. chunked "
             "attention) or run this op on the host")
        raise AssertionError("unreachable")

    @staticmethod
    def _flat_tiling(gen: Generation, n_in: int) -> int:
        """Chunk length for elementwise ops: big enough to amortize a kernel call, spread over
        every core, double-buffered operands well inside L1."""
        per_core = ceil_div(max(1, n_in), gen.cores)
        chunk = 256
        while chunk < FLAT_CHUNK_MAX and chunk < per_core:
            chunk *= 2
        return chunk


@dataclass(frozen=True)
class EmbeddingDesign(Design):
    """Row gather: out[i] = weight[idx[i]] (the DMA does the work: one BD per row)."""

    vocab: int
    dim: int
    n_idx: int
    dtype: torch.dtype
    kind = "embedding"

    def reference(self, inputs, outputs, **scalars) -> None:
        weight, idx = inputs
        outputs[0].copy_(weight[idx.long()].to(outputs[0].dtype))

    def plan(self, gen: Generation) -> Plan:
        """One BD per gathered row, ping-ponged through one column's mem tile; a shim task
        carries as many row BDs as the mem tile has left, tasks beyond the queue depth wait."""
        label = f"embedding {self.vocab}x{self.dim} gather {self.n_idx}"
        row_bytes = self.dim * self.dtype.itemsize
        rows_per_task = gen.memtile_bds.value // 2
        tasks = max(1, ceil_div(self.n_idx, rows_per_task))
        depth = gen.shim_task_queue_depth.value
        plan = Plan(design="embedding", dtype="dma", columns=1, cores=0, tile=(self.dim,),
                    memtile_bytes=2 * row_bytes, memtile_bds=min(self.n_idx, rows_per_task) * 2,
                    shim_tasks=min(depth, tasks), double_buffered=True,
                    dram_read_bytes=self.n_idx * (row_bytes + 8),
                    dram_write_bytes=self.n_idx * row_bytes, compute_cycles=0.0,
                    dma_shapes=(DmaTransfer("table row", (1, self.dim), (self.dim, 1)),),
                    notes={"shim_task_batches": ceil_div(tasks, depth), "memtile_locks": 4,
                           "memtile_dma": (1, 1), "shim_dma": (2, 1)})
        return check_plan(gen, label, plan)
