"""Reductions and row ops on the vector unit, one launch each: softmax/log_softmax, layer norm,
sum/mean/amax, all/any, cumsum (VectorDesign); argmax/argmin, max/min (full and along a dim),
amin, topk, sort, var/std (+ _mean), vector norms (TableDesign ops of kernels/ops/reduce.py)."""
from __future__ import annotations

from typing import Callable

import torch

import torch_xdna.kernels.ops.reduce  # noqa: F401  (defines the table ops)
from torch_xdna.device import fallback, storage
from torch_xdna.device.kernel import (design_for, launch, norm_dims, operands_ok, output_tensor,
                                      reduced_shape, run_table, supported_dtypes)
from torch_xdna.kernels import VectorDesign
from torch_xdna.kernels.ops.reduce import SortDesign, sort_passes

aten = torch.ops.aten
I64 = torch.int64


def _arg(op: str):
    name = f"aten.{op}"

    def kernel(self, dim=None, keepdim=False, *, out=None):
        if not operands_ok(self) or self.dtype == torch.bool:
            return None
        if self.numel() == 0 and (dim is None or self.dim() == 0 or self.shape[dim] == 0):
            raise RuntimeError(f"xdna {op}: cannot reduce an empty tensor (shape "
                               f"{list(self.shape)}) along {'all dims' if dim is None else dim}")
        if dim is None:
            shape = [1] * self.dim() if keepdim else []
            d = None
        else:
            d = int(dim) % max(self.dim(), 1)
            shape = reduced_shape(self, (d,), keepdim)
        res = output_tensor(out, shape, I64)
        run_table(op, [self], [res], name, dim=d, keepdim=bool(keepdim))
        return res
    return kernel


def _minmax_dim(op: str):
    name = f"aten.{op}.dim"

    def kernel(self, dim, keepdim=False, **outs):
        if not operands_ok(self):
            return None
        d = int(dim) % max(self.dim(), 1)
        if self.dim() and self.shape[d] == 0:
            raise RuntimeError(f"xdna {op}: cannot reduce dim {dim} of size 0 (shape "
                               f"{list(self.shape)})")
        shape = reduced_shape(self, (d,), keepdim)
        # out= names of max.dim_max / min.dim_min
        o_v, o_i = outs.get(op), outs.get("max_values" if op == "max" else "min_indices")
        vals = output_tensor(o_v, shape, self.dtype)
        idx = output_tensor(o_i, shape, I64)
        run_table(f"{op}_dim", [self], [vals, idx], name, dim=d, keepdim=bool(keepdim))
        return vals, idx
    return kernel


def _minmax_all(op: str):
    def kernel(self):
        if not operands_ok(self):
            return None
        if self.numel() == 0:
            raise RuntimeError(f"xdna {op}(): expected a non-empty tensor (shape "
                               f"{list(self.shape)}); pass a dim to reduce an empty tensor")
        return run_table(f"{op}_all", [self], [((), self.dtype)], f"aten.{op}")[0]
    return kernel


def amin(self, dim=(), keepdim=False, *, out=None):
    if not operands_ok(self):
        return None
    dims = norm_dims(self, dim)
    res = output_tensor(out, reduced_shape(self, dims, keepdim), self.dtype)
    run_table("amin", [self], [res], "aten.amin", dims=dims or (), keepdim=bool(keepdim))
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


def _values_indices(v, i, like: torch.Tensor, d: int, values, indices) -> tuple:
    """topk/sort results back in `like`'s dim order, written into the out= pair if given."""
    v, i = _from_last(v, like, d), _from_last(i, like, d)
    if values is not None:
        output_tensor(values, v.shape, values.dtype).copy_(v)
        output_tensor(indices, i.shape, indices.dtype).copy_(i)
        return values, indices
    return v, i


def topk(self, k, dim=-1, largest=True, sorted=True, *, values=None, indices=None):
    if not operands_ok(self) or self.dtype == torch.bool:
        return None
    src, d = _to_last(self, dim)
    n = src.shape[-1]
    if not 0 <= k <= n:
        raise RuntimeError(f"xdna topk: k={k} is out of range for dim {dim} of size {n}")
    shape = list(src.shape[:-1]) + [k]
    v = output_tensor(None, shape, self.dtype)
    i = output_tensor(None, shape, I64)
    run_table("topk", [src], [v, i], "aten.topk", design_cls=SortDesign, k=int(k),
              largest=bool(largest),
              sorted=bool(sorted), passes=sort_passes(n))
    return _values_indices(v, i, self, d, values, indices)


def sort(self, dim=-1, descending=False, *, stable=False, values=None, indices=None):
    if not operands_ok(self) or self.dtype == torch.bool:
        return None
    src, d = _to_last(self, dim)
    v = output_tensor(None, src.shape, self.dtype)
    i = output_tensor(None, src.shape, I64)
    run_table("sort", [src], [v, i], "aten.sort", design_cls=SortDesign,
              descending=bool(descending),
              stable=bool(stable), passes=sort_passes(src.shape[-1]))
    return _values_indices(v, i, self, d, values, indices)


def sort_stable(self, *, stable, dim=-1, descending=False, values=None, indices=None):
    return sort(self, dim, descending, stable=bool(stable), values=values, indices=indices)


def _moment(op: str):
    two = op.endswith("_mean")
    name = f"aten.{op}"

    def kernel(self, dim=None, *, correction=None, keepdim=False, out=None):
        if not operands_ok(self, floats_only=True):
            return None
        dims = norm_dims(self, dim)
        shape = reduced_shape(self, dims, keepdim)
        corr = 1.0 if correction is None else float(correction)
        outs = [output_tensor(out, shape, self.dtype)]
        if two:
            outs.append(output_tensor(None, shape, self.dtype))
        run_table(op, [self], outs, name, dims=dims or (), correction=corr,
                  keepdim=bool(keepdim))
        return tuple(outs) if two else outs[0]
    return kernel


def vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    if not operands_ok(self, floats_only=True) or isinstance(ord, complex):
        return None
    dims = norm_dims(self, dim)
    res = output_tensor(out, reduced_shape(self, dims, keepdim),
                        out.dtype if out is not None else (dtype or self.dtype))
    op = "vector_norm_select" if float(ord) in (0.0, float("inf"), -float("inf")) else \
        "vector_norm"
    run_table(op, [self], [res], "aten.linalg_vector_norm", ord=float(ord),
              dims=dims or (), keepdim=bool(keepdim))
    return res


def _rowwise(op: str, x: torch.Tensor, dim: int, aten_name: str, out_dtype=None, **params):
    dim = dim % max(x.dim(), 1)
    src = x if dim == x.dim() - 1 else x.movedim(dim, -1)
    res = storage.empty(src.shape, out_dtype or x.dtype)
    design = design_for(VectorDesign, op, (tuple(src.shape),), (x.dtype,), tuple(src.shape), res.dtype,
                          tuple(sorted({"dim": -1, **params}.items())))
    launch(design, [src], [res], aten_name)
    return res if dim == x.dim() - 1 else res.movedim(-1, dim)


def softmax(self, dim, half_to_float):
    return _rowwise("softmax", self, dim, "aten._softmax",
                    torch.float32 if half_to_float else None)


def log_softmax(self, dim, half_to_float):
    return _rowwise("log_softmax", self, dim, "aten._log_softmax",
                    torch.float32 if half_to_float else None)


def native_layer_norm(x, normalized_shape, weight, bias, eps):
    nd = len(normalized_shape)
    ins = [x] + [t for t in (weight, bias) if t is not None]
    res = storage.empty(x.shape, x.dtype)
    design = design_for(VectorDesign, "layer_norm", tuple(tuple(t.shape) for t in ins),
                          tuple(t.dtype for t in ins), tuple(x.shape), x.dtype,
                          tuple(sorted({"eps": float(eps), "has_weight": weight is not None,
                                        "has_bias": bias is not None, "norm_dims": nd}.items())))
    launch(design, ins, [res], "aten.native_layer_norm")
    # mean/rstd serve autograd only: skip them when no gradient can flow
    stat_shape = list(x.shape[: x.dim() - nd]) + [1] * nd
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in ins)):
        return res, storage.empty(stat_shape, torch.float32), storage.empty(stat_shape, torch.float32)
    xf = storage.host_view(x).float()
    dims = tuple(range(x.dim() - nd, x.dim()))
    mean_h = xf.mean(dims, keepdim=True) if x.numel() else torch.zeros(stat_shape)
    rstd_h = (torch.rsqrt(xf.var(dims, unbiased=False, keepdim=True) + eps) if x.numel()
              else torch.zeros(stat_shape))
    mean = fallback.from_host(mean_h.reshape(stat_shape))
    rstd = fallback.from_host(rstd_h.reshape(stat_shape))
    return res, mean, rstd


def _reduce(op: str, aten_name: str):
    def kernel(self, dim=None, keepdim=False, *, dtype=None, out=None):
        if dim is not None and not isinstance(dim, (list, tuple)):
            dim = [dim]
        dims = tuple(sorted(d % max(self.dim(), 1) for d in dim)) if dim else ()
        out_dtype = dtype or (self.dtype if self.dtype.is_floating_point or op == "amax"
                              else torch.int64)
        if op == "mean" and not out_dtype.is_floating_point:
            raise RuntimeError(f"xdna mean: input dtype {self.dtype} is not a floating dtype; "
                               f"pass dtype=torch.float32")
        ref = torch.empty(self.shape, device="meta").sum(dims if dims else None, keepdim=keepdim) \
            if dims or self.dim() else torch.empty((), device="meta")
        res = storage.empty(ref.shape, out_dtype) if out is None else out
        if out is not None and tuple(out.shape) != tuple(ref.shape):
            out.resize_(ref.shape)
        design = design_for(VectorDesign, op, (tuple(self.shape),), (self.dtype,), tuple(ref.shape), res.dtype,
                              tuple(sorted({"dims": dims, "keepdim": bool(keepdim)}.items())))
        launch(design, [self], [res], aten_name)
        return res
    return kernel




def _bool_reduce(op: str):
    """all / any over all elements or some dims (bool out; uint8 stays uint8, as in torch)."""
    aten_name = f"aten.{op}"

    def kernel(self, dim=None, keepdim=False, *, out=None):
        if not supported_dtypes([self]):
            return None
        if dim is not None and not isinstance(dim, (list, tuple)):
            dim = [dim]
        nd = max(self.dim(), 1)
        dims = tuple(sorted({d % nd for d in dim})) if dim else ()
        shape = reduced_shape(self, dims or None, keepdim)
        res_dtype = torch.uint8 if self.dtype == torch.uint8 else torch.bool
        res = output_tensor(out, shape, res_dtype)
        design = design_for(VectorDesign, op, (tuple(self.shape),), (self.dtype,), tuple(shape),
                            res.dtype, (("dims", dims), ("keepdim", bool(keepdim))))
        launch(design, [self], [res], aten_name)
        return res
    return kernel


def cumsum(self, dim, *, dtype=None, out=None):
    if not supported_dtypes([self]):
        return None
    res_dtype = dtype or (self.dtype if self.dtype.is_floating_point else torch.int64)
    res = output_tensor(out, self.shape, res_dtype)
    if not self.numel():
        return res
    d = dim % max(self.dim(), 1)
    last = self.dim() == 0 or d == self.dim() - 1
    src = self if last else self.movedim(d, -1)
    dst = res if last else res.movedim(d, -1)
    src_shape = tuple(src.shape) or (1,)
    design = design_for(VectorDesign, "cumsum", (src_shape,), (self.dtype,), src_shape, res.dtype,
                        (("dim", -1),))
    launch(design, [src.reshape(src_shape)], [dst.reshape(src_shape)], "aten.cumsum")
    return res


def cumsum_(self, dim, *, dtype=None):
    return cumsum(self, dim, dtype=dtype, out=self)


def register_ops(reg: Callable) -> None:
    reg(aten._softmax.default, softmax)
    reg(aten._log_softmax.default, log_softmax)
    reg(aten.native_layer_norm.default, native_layer_norm)
    reg(aten.sum.default, lambda self, *, dtype=None: _reduce("sum", "aten.sum")(self, None, False, dtype=dtype))
    reg(aten.sum.dim_IntList, _reduce("sum", "aten.sum"))
    reg(aten.sum.IntList_out, _reduce("sum", "aten.sum"))
    reg(aten.mean.default, lambda self, *, dtype=None: _reduce("mean", "aten.mean")(self, None, False, dtype=dtype))
    reg(aten.mean.dim, _reduce("mean", "aten.mean"))
    reg(aten.mean.out, _reduce("mean", "aten.mean"))
    reg(aten.amax.default, _reduce("amax", "aten.amax"))
    for name in ("all", "any"):
        k = _bool_reduce(name)
        for ov in ("default", "dim", "dims", "out", "dims_out", "all_out"):
            reg(getattr(getattr(aten, name), ov), k)
    reg(aten.cumsum.default, cumsum)
    reg(aten.cumsum.out, cumsum)
    reg(aten.cumsum_.default, cumsum_)
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
