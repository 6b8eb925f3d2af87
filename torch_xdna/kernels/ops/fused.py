"""Compiler-fused designs: an elementwise/row chain in one pass, gated GEMM, norm-prologue GEMM.

ChainDesign runs a small expression graph (elementwise ops, row reductions/softmax/norms over the
last dim, and layout ops such as slice/cat/permute that the DMA addresses) in one streaming pass:
each input is read once, each output written once, intermediates stay in core memory. Its
numerics are the per-op policy of VectorDesign: additive ops on the fp32 accumulator path,
everything else on bf16-rounded operands with fp32 results.

Attention is not here: the compiler lowers SDPA to kernels/ops/attention.py's AttentionDesign.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import AIE2P, Generation
from torch_xdna.hw.vector_costs import BF16_LANES, VECTOR_OP_CYCLES
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design, ceil_div, numel
from torch_xdna.kernels.capacity import check_plan
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.runtime.plan import Plan, PlanError


def _gelu(x, approximate="none"):
    return apply_epilogue("gelu_tanh" if approximate == "tanh" else "gelu", x)


def _layer_norm(x, w, b, normalized_shape=(), eps=1e-5):
    return torch.nn.functional.layer_norm(x, tuple(normalized_shape), w, b, eps)


def _add(a, b, alpha=1):
    return a + b * alpha if alpha != 1 else a + b


def _sub(a, b, alpha=1):
    return a - b * alpha if alpha != 1 else a - b


def _where(c, a, b):
    return torch.where(c.bool(), a, b)


def _masked_fill(x, mask, value):
    return torch.where(mask.bool(), value, x)


def _reduce(fn):
    return lambda x, dim=(-1,), keepdim=False: fn(x, tuple(dim), keepdim=keepdim)


def strided_index(x: torch.Tensor, shape: tuple, coeffs: tuple, consts: tuple) -> torch.Tensor:
    """x[idx_0, ..., idx_{K-1}] for idx_k[o] = consts[k] + sum_d coeffs[k][d] * o[d] (o over the
    broadcast index shape) as a view: output dims are the index dims, then x's dims >= K. The
    compiler rewrites a constant affine `index` to this (the DMA reads it by strides)."""
    k = len(consts)
    offset = x.storage_offset() + sum(c * x.stride(i) for i, c in enumerate(consts))
    strides = [sum(coeffs[i][d] * x.stride(i) for i in range(k)) for d in range(len(shape))]
    return x.as_strided(tuple(shape) + tuple(x.shape[k:]), tuple(strides) + tuple(x.stride()[k:]),
                        offset)


def _to(x, dtype=None):
    return x.to(getattr(torch, dtype)) if dtype else x


def _cp(op: str) -> float:
    """Vector passes per element (cycles per 16 elements, the unit of `lanes` below) of `op`
    as one step of a fused chain: its vector-slot instructions from hw/vector_costs.py (derived
    from the mlir-aie AIE2P kernels); the step's operands stay in registers, so no load/store
    bound (cost-v4)."""
    return AIE2P.vector_bits.value // 32 * VECTOR_OP_CYCLES[op].value.instr / BF16_LANES


# op -> (fn(*tensors, **params), vector passes per element (_cp: hw/vector_costs.py; layout ops
# and conversions keep their own), exact on the fp32 accumulator path)
CHAIN_OPS: dict[str, tuple[Callable, float, bool]] = {
    "add": (_add, _cp("add"), True), "sub": (_sub, _cp("sub"), True), "mul": (torch.mul, _cp("mul"), False),
    "div": (torch.div, _cp("div"), False), "neg": (torch.neg, _cp("neg"), True), "abs": (torch.abs, _cp("abs"), True),
    "maximum": (torch.maximum, _cp("maximum"), True), "minimum": (torch.minimum, _cp("minimum"), True),
    "relu": (torch.relu, _cp("relu"), True), "gelu": (_gelu, _cp("gelu"), False), "silu": (lambda x: apply_epilogue("silu", x), _cp("silu"), False),
    "sigmoid": (torch.sigmoid, _cp("sigmoid"), False), "tanh": (torch.tanh, _cp("tanh"), False), "exp": (torch.exp, _cp("exp"), False),
    "rsqrt": (torch.rsqrt, _cp("rsqrt"), False), "sqrt": (torch.sqrt, _cp("sqrt"), False),
    "reciprocal": (torch.reciprocal, _cp("reciprocal"), False), "pow": (torch.pow, _cp("pow"), False),
    "cos": (torch.cos, _cp("cos"), False), "sin": (torch.sin, _cp("sin"), False),
    "erf": (torch.erf, _cp("erf"), False), "log": (torch.log, _cp("log"), False),     # gelu backward, losses
    "where": (_where, _cp("where"), True), "to": (_to, 0.5, True),
    "eq": (torch.eq, _cp("eq"), True), "ne": (torch.ne, _cp("ne"), True), "lt": (torch.lt, _cp("lt"), True),
    "le": (torch.le, _cp("le"), True), "gt": (torch.gt, _cp("gt"), True), "ge": (torch.ge, _cp("ge"), True),
    "logical_not": (torch.logical_not, _cp("logical_not"), True),
    # bool/int compares, selects and bit operations: exact (no arithmetic to round)
    "logical_and": (torch.logical_and, _cp("logical_and"), True), "logical_or": (torch.logical_or, _cp("logical_or"), True),
    "logical_xor": (torch.logical_xor, _cp("logical_xor"), True), "bitwise_and": (torch.bitwise_and, _cp("bitwise_and"), True),
    "bitwise_or": (torch.bitwise_or, _cp("bitwise_or"), True), "bitwise_xor": (torch.bitwise_xor, _cp("bitwise_xor"), True),
    "bitwise_not": (torch.bitwise_not, _cp("bitwise_not"), True), "isnan": (torch.isnan, _cp("isnan"), True),
    "isinf": (torch.isinf, _cp("isinf"), True), "isneginf": (torch.isneginf, _cp("isneginf"), True),
    "isposinf": (torch.isposinf, _cp("isposinf"), True), "clamp": (torch.clamp, _cp("clamp"), True),
    "masked_fill": (_masked_fill, _cp("where"), True),
    # row ops over trailing dims (a row must fit one core's L1)
    "mean": (lambda x, dim=(-1,), keepdim=False: x.mean(tuple(dim), keepdim=keepdim), _cp("mean"), True),
    "sum": (lambda x, dim=(-1,), keepdim=False: x.sum(tuple(dim), keepdim=keepdim), _cp("sum"), True),
    "amax": (lambda x, dim=(-1,), keepdim=False: x.amax(tuple(dim), keepdim=keepdim), _cp("amax"), True),
    "any": (_reduce(torch.any), _cp("any"), True), "all": (_reduce(torch.all), _cp("all"), True),
    "cumsum": (lambda x: torch.cumsum(x, -1), _cp("cumsum"), True),
    "softmax": (lambda x, dim=-1: torch.softmax(x, dim), _cp("softmax"), False),
    "layer_norm": (_layer_norm, _cp("layer_norm"), False),
    # layout: the DMA addresses these; no vector work
    "view": (lambda x, shape=(): x.reshape(shape), 0, True),
    "permute": (lambda x, dims=(): x.permute(dims), 0, True),
    "expand": (lambda x, shape=(): x.expand(shape), 0, True),
    "unsqueeze": (lambda x, dim=0: x.unsqueeze(dim), 0, True),
    "squeeze": (lambda x, dim=(): x.squeeze(dim) if dim != () else x.squeeze(), 0, True),
    "slice": (lambda x, dim=0, start=0, end=None, step=1: x[(slice(None),) * (dim % x.dim())
                                                           + (slice(start, end, step),)], 0, True),
    "select": (lambda x, dim=0, index=0: x.select(dim, index), 0, True),
    "strided_index": (lambda x, shape=(), coeffs=(), consts=(): strided_index(x, shape, coeffs, consts), 0, True),
    "cat": (lambda *xs, dim=0: torch.cat(xs, dim), 0.5, True),
    "copy": (lambda x: x, 0.5, True),
}
ROW_OPS = {"mean", "sum", "amax", "softmax", "layer_norm", "any", "all", "cumsum"}


def _is_ref(a) -> bool:
    return isinstance(a, tuple) and len(a) == 2 and a[0] in ("in", "s")


@dataclass(frozen=True)
class ChainDesign(Design):
    """steps: ((op, args, params), ...); an arg is ("in", i) | ("s", j) | a Python scalar | None,
    or a tuple of those (cat). outputs: indices of the steps whose values are written out."""

    in_shapes: tuple
    in_dtypes: tuple
    steps: tuple
    outputs: tuple
    out_dtypes: tuple
    kind = "chain"

    @property
    def name(self) -> str:
        ops = [s[0] for s in self.steps if CHAIN_OPS[s[0]][1] > 0 or s[0] == "cat"]
        if len(ops) > 4:
            ops = ops[:3] + [f"..{len(ops) - 3}"]
        return "chain[" + "+".join(ops or ["copy"]) + "]"

    def _evaluate(self, xs: list[torch.Tensor], meta: bool) -> list[torch.Tensor]:
        """Every step's value (in step order)."""
        vals: list[torch.Tensor] = []

        def get(a, exact):
            if isinstance(a, tuple) and not _is_ref(a):
                return [get(x, exact) for x in a]
            if not _is_ref(a):
                return a
            v = xs[a[1]] if a[0] == "in" else vals[a[1]]
            if not exact and not meta and isinstance(v, torch.Tensor) and v.is_floating_point():
                v = numerics.operand(v)
            return v

        for op, args, params in self.steps:
            fn, _, exact = CHAIN_OPS[op]
            vs = [get(a, exact) for a in args]
            if op == "cat":
                vs = vs[0]
            vals.append(fn(*vs, **dict(params)))
        return vals

    def chain_outputs(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The chain's output values (fp32/bool, unstored) for real inputs."""
        xs = [x.float() if x.is_floating_point() else x for x in inputs]
        vals = self._evaluate(xs, meta=False)
        return [vals[i] for i in self.outputs]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        for val, out in zip(self.chain_outputs(inputs), outputs):
            numerics.store(val.expand(out.shape) if tuple(val.shape) != tuple(out.shape) else val, out)

    @cached_property
    def _meta(self) -> tuple[list[int], list[int]]:
        """(elements per step, row length of each row op) from a shape-only evaluation."""
        xs = [torch.empty(s, dtype=getattr(torch, d), device="meta").float()
              if getattr(torch, d).is_floating_point else torch.empty(s, dtype=getattr(torch, d), device="meta")
              for s, d in zip(self.in_shapes, self.in_dtypes)]
        vals = self._evaluate(xs, meta=True)
        rows = []
        for op, args, _ in self.steps:
            if op in ROW_OPS:
                first = args[0]
                shape = xs[first[1]].shape if first[0] == "in" else vals[first[1]].shape
                rows.append(int(shape[-1]) if len(shape) else 1)
        return [v.numel() for v in vals], rows

    def plan(self, gen: Generation) -> Plan:
        counts, rows = self._meta
        read = sum(numel(s) * getattr(torch, d).itemsize for s, d in zip(self.in_shapes, self.in_dtypes))
        write = sum(counts[i] * getattr(torch, d).itemsize for i, d in zip(self.outputs, self.out_dtypes))
        elem_ops = sum(CHAIN_OPS[s[0]][1] * c for s, c in zip(self.steps, counts))
        n = max(counts + [1])
        chunk = max([256] + rows)                       # elements per tile (a row must fit)
        live = min(len(self.steps), 4)                   # intermediates held per tile
        ios = len(self.in_shapes) + len(self.outputs)
        l1 = 2 * chunk * 4 * ios + chunk * 4 * live
        name = self.name
        if l1 > gen.l1_usable:
            raise PlanError(name, "L1 data memory", l1, gen.l1_usable,
                            "a row (and the chain's operands) must fit one core's L1; split the chain")
        lanes = gen.vector_bits.value // 32
        cores = min(gen.cores, max(1, ceil_div(n, chunk)))
        plan = Plan(design="chain", dtype="fp32-vec", columns=min(gen.columns.value, cores),
                    cores=cores, tile=(chunk,), l1_bytes=l1,
                    memtile_bytes=min(gen.memtile_bytes.value, 2 * chunk * 4 * 4),
                    core_bds=2 * ios, core_locks=2 * ios, double_buffered=True,
                    dram_read_bytes=int(read), dram_write_bytes=int(write),
                    vector_elems=int(elem_ops), compute_cycles=elem_ops / (lanes * cores))
        return check_plan(gen, name, plan)


@dataclass(frozen=True)
class GatedGemmDesign(Design):
    """out = act(A @ Wg) * (A @ Wu): a gated MLP's gate and up projections as ONE GEMM over the
    2N concatenated weight columns (A is read once), the gating done on the accumulators."""

    m: int
    k: int
    n: int
    batch: int = 1
    dtype: str = "bf16"
    out_dtype: torch.dtype = torch.float32
    act: str = "silu"
    kind = "gated_gemm"

    @property
    def name(self) -> str:
        return f"gated_gemm[{self.dtype}]+{self.act}"

    def _gemm(self, n: int, epilogue: str = "none") -> GemmDesign:
        return GemmDesign(self.m, self.k, n, batch=self.batch, dtype=self.dtype, epilogue=epilogue)

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        a, wg, wu = inputs
        shape = tuple(outputs[0].shape)
        g, u = torch.empty(shape), torch.empty(shape)
        self._gemm(self.n, self.act).reference([a, wg], [g])
        self._gemm(self.n).reference([a, wu], [u])
        numerics.store(g * u, outputs[0])              # fp32 accumulators, gated in core

    def plan(self, gen: Generation) -> Plan:
        p = self._gemm(2 * self.n).plan(gen)
        elems = self.batch * self.m * self.n
        lanes = gen.vector_bits.value // 32
        out = elems * self.out_dtype.itemsize
        return dataclasses.replace(
            p, design="gated_gemm", dram_write_bytes=out, vector_elems=p.vector_elems + 6 * elems,
            compute_cycles=p.compute_cycles + 6 * elems / (lanes * max(1, p.cores)))


@dataclass(frozen=True)
class PrologueGemmDesign(Design):
    """A chain (e.g. residual add + LayerNorm/RMSNorm) computed on A's row blocks as they enter
    the array, then the GEMM on the result: the normalized activations never round-trip DRAM
    unless `keep` says another consumer needs a chain output.

    inputs: chain inputs, then the GEMM's inputs after A. outputs: kept chain outputs, then the
    GEMM's outputs. `a_out` is the chain output that is A (viewed as the GEMM's A shape)."""

    chain: ChainDesign
    gemm: Design
    a_out: int
    keep: tuple                       # per chain output: written to DRAM
    a_shape: tuple
    kind = "prologue_gemm"

    @property
    def name(self) -> str:
        return f"{self.chain.name}>{self.gemm.name}"

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        n_in = len(self.chain.in_shapes)
        outs, kept = [], iter(outputs)
        for keep, d in zip(self.keep, self.chain.out_dtypes):
            outs.append(next(kept) if keep else None)
        vals = self.chain.chain_outputs(list(inputs[:n_in]))
        for o, v in zip(outs, vals):
            if o is not None:
                numerics.store(v.expand(o.shape) if tuple(v.shape) != tuple(o.shape) else v, o)
        a = vals[self.a_out]
        a_dtype = getattr(torch, self.chain.out_dtypes[self.a_out])
        a = a.to(a_dtype).reshape(self.a_shape)            # as stored, then read by the GEMM
        self.gemm.reference([a, *inputs[n_in:]], list(kept))

    def plan(self, gen: Generation) -> Plan:
        cp, gp = self.chain.plan(gen), self.gemm.plan(gen)
        k = self.a_shape[-1]
        block = 2 * (gp.tile[0] if gp.tile else 1) * k * 4        # A row block with whole rows
        if block > gen.memtile_bytes.value:
            raise PlanError(self.name, "mem tile memory (whole A rows for the prologue)", block,
                            gen.memtile_bytes.value, "run the norm as its own launch")
        a_bytes = numel(self.a_shape) * 2
        counts, _ = self.chain._meta
        out_bytes = [counts[i] * getattr(torch, d).itemsize
                     for i, d in zip(self.chain.outputs, self.chain.out_dtypes)]
        write_dropped = sum(b for b, keep in zip(out_bytes, self.keep) if not keep)
        return dataclasses.replace(
            gp, design="prologue_gemm", vector_elems=gp.vector_elems + cp.vector_elems,
            dram_read_bytes=max(0, cp.dram_read_bytes + gp.dram_read_bytes - a_bytes),
            dram_write_bytes=gp.dram_write_bytes + cp.dram_write_bytes - write_dropped,
            compute_cycles=gp.compute_cycles + cp.compute_cycles)
