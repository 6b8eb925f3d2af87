"""Reductions with indices, selections and moments: argmax/argmin, max/min (full and along a
dim), amin, topk, sort, var/std (+ _mean). One vector-unit launch each (kernels/ops/reduce.py)."""
from __future__ import annotations

from typing import Callable

import torch

import torch_xdna.kernels.ops.reduce  # noqa: F401  (defines the table ops)
from torch_xdna.device import table
from torch_xdna.kernels.ops.reduce import SortDesign, sort_passes

aten = torch.ops.aten
I64 = torch.int64


def _arg(op: str):
    name = f"aten.{op}"

    def kernel(self, dim=None, keepdim=False, *, out=None):
        if not table.ok(self) or self.dtype == torch.bool:
            return None
        if self.numel() == 0 and (dim is None or self.dim() == 0 or self.shape[dim] == 0):
            raise RuntimeError(f"xdna {op}: cannot reduce an empty tensor (shape "
                               f"{list(self.shape)}) along {'all dims' if dim is None else dim}")
        if dim is None:
            shape = [1] * self.dim() if keepdim else []
            d = None
        else:
            d = int(dim) % max(self.dim(), 1)
            shape = table.reduced_shape(self, (d,), keepdim)
        res = table.output(out, shape, I64)
        table.run(op, [self], [res], name, dim=d, keepdim=bool(keepdim))
        return res
    return kernel


def _minmax_dim(op: str):
    name = f"aten.{op}.dim"

    def kernel(self, dim, keepdim=False, **outs):
        if not table.ok(self):
            return None
        d = int(dim) % max(self.dim(), 1)
        if self.dim() and self.shape[d] == 0:
            raise RuntimeError(f"xdna {op}: cannot reduce dim {dim} of size 0 (shape "
                               f"{list(self.shape)})")
        shape = table.reduced_shape(self, (d,), keepdim)
        # out= names of max.dim_max / min.dim_min
        o_v, o_i = outs.get(op), outs.get("max_values" if op == "max" else "min_indices")
        vals = table.output(o_v, shape, self.dtype)
        idx = table.output(o_i, shape, I64)
        table.run(f"{op}_dim", [self], [vals, idx], name, dim=d, keepdim=bool(keepdim))
        return vals, idx
    return kernel


def _minmax_all(op: str):
    def kernel(self):
        if not table.ok(self):
            return None
        if self.numel() == 0:
            raise RuntimeError(f"xdna {op}(): expected a non-empty tensor (shape "
                               f"{list(self.shape)}); pass a dim to reduce an empty tensor")
        return table.run(f"{op}_all", [self], [((), self.dtype)], f"aten.{op}")[0]
    return kernel


def amin(self, dim=(), keepdim=False, *, out=None):
    if not table.ok(self):
        return None
    dims = table.norm_dims(self, dim)
    res = table.output(out, table.reduced_shape(self, dims, keepdim), self.dtype)
    table.run("amin", [self], [res], "aten.amin", dims=dims or (), keepdim=bool(keepdim))
    return res


def _to_last(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
    if x.dim() == 0:
        return x.reshape(1), 0
    d = dim % x.dim()
    return (x if d == x.dim() - 1 else x.movedim(d, -1)), d


def _from_last(t: torch.Tensor, like: torch.Tensor, d: int) -> torch.Tensor:
    if like.dim() == 0:
        return t.reshape(())
    return t if d == like.dim() - 1 else t.movedim(-1, d)


def topk(self, k, dim=-1, largest=True, sorted=True, *, values=None, indices=None):
    if not table.ok(self) or self.dtype == torch.bool:
        return None
    src, d = _to_last(self, dim)
    n = src.shape[-1]
    if not 0 <= k <= n:
        raise RuntimeError(f"xdna topk: k={k} is out of range for dim {dim} of size {n}")
    shape = list(src.shape[:-1]) + [k]
    v = table.output(None, shape, self.dtype)
    i = table.output(None, shape, I64)
    table.run("topk", [src], [v, i], "aten.topk", design_cls=SortDesign, k=int(k),
              largest=bool(largest),
              sorted=bool(sorted), passes=sort_passes(n))
    v, i = _from_last(v, self, d), _from_last(i, self, d)
    if values is not None:
        table.output(values, v.shape, values.dtype).copy_(v)
        table.output(indices, i.shape, indices.dtype).copy_(i)
        return values, indices
    return v, i


def sort(self, dim=-1, descending=False, *, stable=False, values=None, indices=None):
    if not table.ok(self) or self.dtype == torch.bool:
        return None
    src, d = _to_last(self, dim)
    v = table.output(None, src.shape, self.dtype)
    i = table.output(None, src.shape, I64)
    table.run("sort", [src], [v, i], "aten.sort", design_cls=SortDesign,
              descending=bool(descending),
              stable=bool(stable), passes=sort_passes(src.shape[-1]))
    v, i = _from_last(v, self, d), _from_last(i, self, d)
    if values is not None:
        table.output(values, v.shape, values.dtype).copy_(v)
        table.output(indices, i.shape, indices.dtype).copy_(i)
        return values, indices
    return v, i


def sort_stable(self, *, stable, dim=-1, descending=False, values=None, indices=None):
    return sort(self, dim, descending, stable=bool(stable), values=values, indices=indices)


def _moment(op: str):
    two = op.endswith("_mean")
    name = f"aten.{op}"

    def kernel(self, dim=None, *, correction=None, keepdim=False, out=None):
        if not table.ok(self, floats_only=True):
            return None
        dims = table.norm_dims(self, dim)
        shape = table.reduced_shape(self, dims, keepdim)
        corr = 1.0 if correction is None else float(correction)
        outs = [table.output(out, shape, self.dtype)]
        if two:
            outs.append(table.output(None, shape, self.dtype))
        table.run(op, [self], outs, name, dims=dims or (), correction=corr,
                  keepdim=bool(keepdim))
        return tuple(outs) if two else outs[0]
    return kernel


def vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    if not table.ok(self, floats_only=True) or isinstance(ord, complex):
        return None
    dims = table.norm_dims(self, dim)
    res = table.output(out, table.reduced_shape(self, dims, keepdim),
                       out.dtype if out is not None else (dtype or self.dtype))
    op = "vector_norm_select" if float(ord) in (0.0, float("inf"), -float("inf")) else \
        "vector_norm"
    table.run(op, [self], [res], "aten.linalg_vector_norm", ord=float(ord),
              dims=dims or (), keepdim=bool(keepdim))
    return res


def register_ops(reg: Callable) -> None:
    for op in ("argmax", "argmin"):
        k = _arg(op)
        reg(getattr(aten, op).default, k)
        reg(getattr(aten, op).out, k)
    for op in ("max", "min"):
        k = _minmax_dim(op)
        reg(getattr(aten, op).dim, k)
        reg(getattr(aten, op).dim_max if op == "max" else aten.min.dim_min, k)
        reg(getattr(aten, op).default, _minmax_all(op))
    reg(aten.amin.default, amin)
    reg(aten.amin.out, amin)
    reg(aten.topk.default, topk)
    reg(aten.topk.values, topk)
    reg(aten.sort.default, sort)
    reg(aten.sort.stable, sort_stable)
    reg(aten.sort.values_stable, sort_stable)
    for op in ("var", "std"):
        reg(getattr(aten, op).correction, _moment(op))
        reg(getattr(aten, op).correction_out, _moment(op))
    for op in ("var_mean", "std_mean"):
        reg(getattr(aten, op).correction, _moment(op))
    reg(aten.linalg_vector_norm.default, vector_norm)
    reg(aten.linalg_vector_norm.out, vector_norm)
