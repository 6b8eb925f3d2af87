"""Vector-unit designs: elementwise chains, reductions, softmax, norms, embedding gather.

These stream their operands through the array once: DRAM bytes are the operands plus the result,
compute is element-ops over the vector lanes of the cores used. Each op has a cost in vector
cycles per element (transcendentals cost more), kept here next to its reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design, ceil_div, numel
from torch_xdna.runtime.plan import Plan, PlanError

# op -> (reference on fp32/int values, vector passes per element)
def _binary(fn: Callable) -> Callable:
    return lambda xs, **kw: fn(xs[0], xs[1])


def _softmax(xs, dim, **kw):
    return torch.softmax(xs[0], dim)


def _log_softmax(xs, dim, **kw):
    return torch.log_softmax(xs[0], dim)


def _layer_norm(xs, eps, has_weight, has_bias, norm_dims, **kw):
    x = xs[0]
    dims = tuple(range(-norm_dims, 0))
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dims, keepdim=True)
    y = (x - mean) * torch.rsqrt(var + eps)
    i = 1
    if has_weight:
        y = y * xs[i]
        i += 1
    if has_bias:
        y = y + xs[i]
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
    "add": (lambda xs, alpha=1.0, **kw: xs[0] + alpha * xs[1] if alpha != 1.0 else xs[0] + xs[1], 1),
    "sub": (lambda xs, alpha=1.0, **kw: xs[0] - alpha * xs[1] if alpha != 1.0 else xs[0] - xs[1], 1),
    "mul": (_binary(torch.mul), 1),
    "div": (_binary(torch.div), 4),
    "maximum": (_binary(torch.maximum), 1),
    "minimum": (_binary(torch.minimum), 1),
    "neg": (lambda xs, **kw: -xs[0], 1),
    "relu": (lambda xs, **kw: apply_epilogue("relu", xs[0]), 1),
    "gelu": (lambda xs, **kw: apply_epilogue("gelu", xs[0]), 6),
    "gelu_tanh": (lambda xs, **kw: apply_epilogue("gelu_tanh", xs[0]), 6),
    "silu": (lambda xs, **kw: apply_epilogue("silu", xs[0]), 5),
    "sigmoid": (lambda xs, **kw: torch.sigmoid(xs[0]), 5),
    "tanh": (lambda xs, **kw: torch.tanh(xs[0]), 5),
    "exp": (lambda xs, **kw: torch.exp(xs[0]), 4),
    "rsqrt": (lambda xs, **kw: torch.rsqrt(xs[0]), 4),
    "sqrt": (lambda xs, **kw: torch.sqrt(xs[0]), 4),
    "softmax": (_softmax, 6),
    "log_softmax": (_log_softmax, 7),
    "layer_norm": (_layer_norm, 6),
    "rms_norm": (_rms_norm, 4),
    "sum": (_reduce(torch.sum), 1),
    "mean": (_reduce(torch.mean), 1),
    "amax": (_reduce(torch.amax), 1),
    "copy": (lambda xs, **kw: xs[0], 0.5),
    "where": (lambda xs, **kw: torch.where(xs[0].bool(), xs[1], xs[2]), 1),
}
# ops whose arithmetic is only adds, so fp32 operands stay exact (accumulator path)
EXACT_FP32 = {"add", "sub", "neg", "relu", "maximum", "minimum", "copy", "where", "sum", "mean", "amax"}


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
        exact = self.op in EXACT_FP32
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
        _, passes = OPS[self.op]
        n_out = numel(self.out_shape)
        n_in = max([numel(s) for s in self.in_shapes] + [n_out])
        read = sum(numel(s) * d.itemsize for s, d in zip(self.in_shapes, self.in_dtypes))
        write = n_out * self.out_dtype.itemsize
        lanes = gen.vector_bits.value // 32          # fp32 lanes per cycle per core
        # one tile of each operand, double-buffered, in L1 (chunk of 1024 elements)
        chunk = 1024
        row = dict(self.params).get("row", 0)
        if self.op in ("softmax", "log_softmax", "layer_norm", "rms_norm"):
            row = self.in_shapes[0][-1] if self.in_shapes[0] else 1
            chunk = max(chunk, row)
        l1 = 2 * chunk * 4 * (len(self.in_shapes) + 1)
        if l1 > gen.l1_usable:
            raise PlanError(f"{self.op} over rows of {row}", "L1 data memory", l1, gen.l1_usable,
                            "a row must fit one core's L1; split the row")
        tiles = max(1, ceil_div(n_in, chunk))
        cores = min(gen.cores, tiles)
        cols = min(gen.columns.value, cores)
        cycles = passes * n_in / (lanes * cores) if n_in else 0.0
        return Plan(design="vector", dtype="fp32-vec", columns=cols, cores=cores, tile=(chunk,),
                    l1_bytes=l1, memtile_bytes=min(gen.memtile_bytes.value, 2 * chunk * 4 * 4),
                    core_bds=2 * (len(self.in_shapes) + 1), core_locks=2 * (len(self.in_shapes) + 1),
                    double_buffered=True, dram_read_bytes=read, dram_write_bytes=write,
                    vector_elems=int(passes * n_in), compute_cycles=cycles)


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
        row_bytes = self.dim * self.dtype.itemsize
        return Plan(design="embedding", dtype="dma", columns=1, cores=0, tile=(self.dim,),
                    memtile_bytes=min(gen.memtile_bytes.value, 2 * row_bytes), memtile_bds=2,
                    double_buffered=True, dram_read_bytes=self.n_idx * (row_bytes + 8),
                    dram_write_bytes=self.n_idx * row_bytes, compute_cycles=0.0)
