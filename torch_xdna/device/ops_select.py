"""Selection and indexing: tril/triu, clamp with tensor bounds, pow with tensor exponents /
scalar bases, sign, logit, scatter / scatter_add (one_hot decomposes into these) on the vector
unit (TableDesign ops of kernels/ops/select.py); concatenation, gathers and embedding through the
DMA (kernels/ops/dma.py). One launch each."""
from __future__ import annotations

from typing import Callable

import torch

import torch_xdna.kernels.ops.select  # noqa: F401  (defines the table ops)
from torch_xdna.device import storage
from torch_xdna.device.kernel import (as_device_operand, clamp_bounds, design_for, is_xdna, launch,
                                      operands_ok, output_tensor, register_modes, run_table,
                                      supported_dtypes)
from torch_xdna.kernels import EmbeddingDesign
from torch_xdna.kernels.ops.dma import ConcatDesign, GatherDesign

aten = torch.ops.aten


def _tri(op: str, mode: str):
    def kernel(self, diagonal=0, *, out=None):
        if not operands_ok(self):
            return None
        if self.dim() < 2:
            raise RuntimeError(f"xdna {op}: input tensor must have at least 2 dimensions, got "
                               f"{self.dim()}")
        res = self if mode == "inplace" else output_tensor(out, self.shape, self.dtype)
        run_table(op, [self], [res], f"aten.{op}" + ("_" if mode == "inplace" else ""),
                  diagonal=int(diagonal))
        return res
    return kernel


def _clamp_tensor(which: str, mode: str):
    def kernel(self, *args, out=None, **kw):
        lo, hi = clamp_bounds(which, args, kw)
        if lo is None and hi is None:
            raise RuntimeError("xdna clamp: at least one of 'min' or 'max' must not be None")
        bounds = [as_device_operand(b, self.dtype) if b.dim() == 0 and b.device.type != "xdna"
                  else b for b in (lo, hi) if b is not None]
        if not operands_ok(self, *bounds):
            return None
        dtype = self.dtype
        for b in bounds:
            dtype = torch.promote_types(dtype, b.dtype)
        shape = tuple(torch.broadcast_shapes(self.shape, *[b.shape for b in bounds]))
        if mode == "inplace" and tuple(self.shape) != shape:
            raise RuntimeError(f"xdna {which}_: output with shape {list(self.shape)} doesn't "
                               f"match the broadcast shape {list(shape)}")
        views = [t if tuple(t.shape) == shape else t.expand(shape) for t in [self] + bounds]
        res = self if mode == "inplace" else output_tensor(out, shape, out.dtype if out is not None
                                                                 else dtype)
        run_table("clamp_tensor", views, [res], f"aten.{which}", has_min=lo is not None,
                  has_max=hi is not None)
        return res
    return kernel


def _pow_tensor(mode: str):
    """pow.Tensor_Tensor / pow_.Tensor / pow.Scalar (scalar base, tensor exponent)."""
    def kernel(self, exponent, *, out=None):
        if not isinstance(self, torch.Tensor):            # pow.Scalar(Scalar self, Tensor exp)
            if not operands_ok(exponent) or isinstance(self, complex):
                return None
            dtype = torch.result_type(self, exponent)
            res = output_tensor(out, exponent.shape, out.dtype if out is not None else dtype)
            run_table("pow_tensor", [exponent], [res], "aten.pow", base=self)
            return res
        if isinstance(exponent, torch.Tensor) and exponent.dim() == 0 and \
                exponent.device.type != "xdna":
            exponent = as_device_operand(exponent, exponent.dtype)
        if not operands_ok(self, exponent):
            return None
        dtype = torch.result_type(self, exponent)
        shape = tuple(torch.broadcast_shapes(self.shape, exponent.shape))
        if mode == "inplace" and tuple(self.shape) != shape:
            raise RuntimeError(f"xdna pow_: output with shape {list(self.shape)} doesn't match "
                               f"the broadcast shape {list(shape)}")
        views = [t if tuple(t.shape) == shape else t.expand(shape) for t in (self, exponent)]
        res = self if mode == "inplace" else output_tensor(out, shape, out.dtype if out is not None
                                                                 else dtype)
        run_table("pow_tensor", views, [res], "aten.pow_" if mode == "inplace" else "aten.pow")
        return res
    return kernel


def _scatter(op: str, mode: str, kind: str):
    """kind: 'src' (tensor source), 'value' (scalar source), 'add' (scatter_add)."""
    name = f"aten.{op}" + ("_" if mode == "inplace" else "")

    def kernel(self, dim, index, src, *, reduce=None, out=None):
        if not operands_ok(self, index) or index.dtype not in (torch.int64, torch.int32):
            return None
        if kind != "value" and not operands_ok(src):
            return None
        d = int(dim) % max(self.dim(), 1)
        res = self if mode == "inplace" else output_tensor(out, self.shape, self.dtype)
        ins = [self, index] + ([src] if kind != "value" else [])
        params = {"dim": d}
        if kind == "value":
            params["value"] = src.item() if isinstance(src, torch.Tensor) else src
        if reduce is not None:
            params["reduce"] = reduce
        run_table("scatter_add" if kind == "add" else "scatter", ins, [res], name, **params)
        return res
    return kernel


def _sign(mode: str):
    def kernel(self, *, out=None):
        if not operands_ok(self) or self.dtype == torch.bool:
            return None
        res = self if mode == "inplace" else output_tensor(out, self.shape, self.dtype)
        run_table("sign", [self], [res], "aten.sign")
        return res
    return kernel


def logit(self, eps=None, *, out=None):
    if not operands_ok(self) or self.dtype == torch.bool:
        return None
    dtype = self.dtype if self.dtype.is_floating_point else torch.get_default_dtype()
    res = output_tensor(out, self.shape, out.dtype if out is not None else dtype)
    run_table("logit", [self], [res], "aten.logit", eps=None if eps is None else float(eps))
    return res


# --- data movement (DMA only) -----------------------------------------------------------------
def cat(tensors, dim=0, *, out=None):
    if any(not is_xdna(t) for t in tensors):
        bad = next(t for t in tensors if not is_xdna(t))
        raise RuntimeError(f"xdna cat: expected all tensors on 'xdna', got a {bad.device} tensor of "
                           f"shape {list(bad.shape)}; move it with .to('xdna')")
    if not supported_dtypes(tensors):
        return None
    # legacy rule: 1-D empty tensors are skipped whatever the other shapes are
    parts = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if not parts:
        return output_tensor(out, (0,), dtype)
    ref = parts[0]
    d = dim % ref.dim() if ref.dim() else 0
    for t in parts:
        if t.dim() != ref.dim() or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref.shape))
                                       if i != d):
            raise RuntimeError(f"xdna cat: sizes of tensors must match except in dimension {d}; "
                               f"got {list(ref.shape)} and {list(t.shape)}")
    shape = list(ref.shape)
    shape[d] = sum(t.shape[d] for t in parts)
    res = output_tensor(out, shape, out.dtype if out is not None else dtype)
    if res.numel():
        # a DMA moves bytes and cannot convert: mixed dtypes are converted first (counted copies)
        parts = [t if t.dtype == res.dtype else t.to(res.dtype) for t in parts]
        design = design_for(ConcatDesign, tuple(tuple(t.shape) for t in parts), res.dtype, d,
                            tuple(shape))
        launch(design, parts, [res], "aten.cat")
    return res


def _gather_launch(mode: str, src: torch.Tensor, idx: list[torch.Tensor], shape, out, params,
                   aten_name: str) -> torch.Tensor:
    res = output_tensor(out, shape, out.dtype if out is not None else src.dtype)
    if res.numel():
        design = design_for(GatherDesign, mode, (tuple(src.shape),) + tuple(tuple(i.shape) for i in idx),
                            src.dtype, tuple(shape), tuple(sorted(params.items())))
        launch(design, [src] + idx, [res], aten_name)
    return res


def _index_ok(name: str, src, idx) -> bool:
    return supported_dtypes([src, idx]) and is_xdna(idx) and \
        idx.dtype in (torch.int64, torch.int32)


def index_select(self, dim, index, *, out=None):
    if not _index_ok("aten.index_select", self, index):
        return None
    d = dim % max(self.dim(), 1)
    shape = list(self.shape)
    if self.dim():
        shape[d] = index.numel()
    return _gather_launch("index_select", self, [index.reshape(-1)], shape, out, {"dim": d},
                          "aten.index_select")


def gather(self, dim, index, *, sparse_grad=False, out=None):
    if out is None and is_xdna(self) and is_xdna(index) and index.numel() == 0:
        return torch.empty(index.shape, dtype=self.dtype, device=self.device)   # as the CPU: any index dtype
    if not _index_ok("aten.gather", self, index):
        return None
    d = dim % max(self.dim(), 1)
    return _gather_launch("gather", self, [index], list(index.shape), out, {"dim": d}, "aten.gather")


def index(self, indices, *, out=None):
    """Advanced indexing with integer index tensors (bool masks have data-dependent shapes:
    those go to the fallback policy)."""
    present = [i for i in indices if i is not None]
    if not present or not all(_index_ok("aten.index", self, i) for i in present):
        return None
    meta = torch.ops.aten.index.Tensor(
        torch.empty(self.shape, device="meta", dtype=self.dtype),
        [None if i is None else torch.empty(i.shape, device="meta", dtype=i.dtype) for i in indices])
    params = {"n_slots": len(indices),
              "none_slots": tuple(k for k, i in enumerate(indices) if i is None)}
    return _gather_launch("index", self, present, list(meta.shape), out, params, "aten.index")


def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    res = storage.empty(tuple(indices.shape) + (weight.shape[1],), weight.dtype)
    idx = indices.reshape(-1)
    design = design_for(EmbeddingDesign, weight.shape[0], weight.shape[1], idx.numel(), weight.dtype)
    launch(design, [weight, idx], [res.view(idx.numel(), weight.shape[1])], "aten.embedding")
    return res


def register_ops(reg: Callable) -> None:
    for op in ("tril", "triu"):
        register_modes(reg, op, lambda mode, op=op: _tri(op, mode))
    for op in ("clamp", "clamp_min", "clamp_max"):
        register_modes(reg, op, lambda mode, op=op: _clamp_tensor(op, mode), "Tensor")
    reg(aten.pow.Tensor_Tensor, _pow_tensor("functional"))
    reg(aten.pow.Tensor_Tensor_out, _pow_tensor("out"))
    reg(aten.pow_.Tensor, _pow_tensor("inplace"))
    reg(aten.pow.Scalar, _pow_tensor("functional"))
    reg(aten.pow.Scalar_out, _pow_tensor("out"))
    for ov, kind in (("src", "src"), ("value", "value"), ("reduce", "src"),
                     ("value_reduce", "value")):
        register_modes(reg, "scatter", lambda mode, kind=kind: _scatter("scatter", mode, kind), ov)
    register_modes(reg, "scatter_add", lambda mode: _scatter("scatter_add", mode, "add"))
    for op in ("sign", "sgn"):
        register_modes(reg, op, _sign)
    for fn in (logit, cat, index_select, gather):
        packet = getattr(aten, fn.__name__)
        reg(packet.default, fn)
        reg(packet.out, fn)
    reg(aten.index.Tensor, index)
    reg(aten.index.Tensor_out, index)
    reg(aten.embedding.default, embedding)
