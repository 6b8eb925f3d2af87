"""tril/triu, clamp with tensor bounds, pow with tensor exponents / scalar bases, scatter /
scatter_add (one_hot decomposes into these), and the matmul-shaped ops baddbmm, mv, addmv, dot
as GEMM/GEMV designs. One launch each."""
from __future__ import annotations

from typing import Callable

import torch

import torch_xdna.kernels.ops.select  # noqa: F401  (defines the table ops)
from torch_xdna.device import storage, table
from torch_xdna.device.ops import _check_mm, _gemm_dtype, _out_for_gemm, as_device_operand, \
    clamp_bounds, design_for, launch
from torch_xdna.kernels import GemmDesign

aten = torch.ops.aten


def _tri(op: str, mode: str):
    def kernel(self, diagonal=0, *, out=None):
        if not table.ok(self):
            return None
        if self.dim() < 2:
            raise RuntimeError(f"xdna {op}: input tensor must have at least 2 dimensions, got "
                               f"{self.dim()}")
        res = self if mode == "inplace" else table.output(out, self.shape, self.dtype)
        table.run(op, [self], [res], f"aten.{op}" + ("_" if mode == "inplace" else ""),
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
        if not table.ok(self, *bounds):
            return None
        dtype = self.dtype
        for b in bounds:
            dtype = torch.promote_types(dtype, b.dtype)
        shape = tuple(torch.broadcast_shapes(self.shape, *[b.shape for b in bounds]))
        if mode == "inplace" and tuple(self.shape) != shape:
            raise RuntimeError(f"xdna {which}_: output with shape {list(self.shape)} doesn't "
                               f"match the broadcast shape {list(shape)}")
        views = [t if tuple(t.shape) == shape else t.expand(shape) for t in [self] + bounds]
        res = self if mode == "inplace" else table.output(out, shape, out.dtype if out is not None
                                                          else dtype)
        table.run("clamp_tensor", views, [res], f"aten.{which}", has_min=lo is not None,
                  has_max=hi is not None)
        return res
    return kernel


def _pow_tensor(mode: str):
    """pow.Tensor_Tensor / pow_.Tensor / pow.Scalar (scalar base, tensor exponent)."""
    def kernel(self, exponent, *, out=None):
        if not isinstance(self, torch.Tensor):            # pow.Scalar(Scalar self, Tensor exp)
            if not table.ok(exponent) or isinstance(self, complex):
                return None
            dtype = torch.result_type(self, exponent)
            res = table.output(out, exponent.shape, out.dtype if out is not None else dtype)
            table.run("pow_tensor", [exponent], [res], "aten.pow", base=self)
            return res
        if isinstance(exponent, torch.Tensor) and exponent.dim() == 0 and \
                exponent.device.type != "xdna":
            exponent = as_device_operand(exponent, exponent.dtype)
        if not table.ok(self, exponent):
            return None
        dtype = torch.result_type(self, exponent)
        shape = tuple(torch.broadcast_shapes(self.shape, exponent.shape))
        if mode == "inplace" and tuple(self.shape) != shape:
            raise RuntimeError(f"xdna pow_: output with shape {list(self.shape)} doesn't match "
                               f"the broadcast shape {list(shape)}")
        views = [t if tuple(t.shape) == shape else t.expand(shape) for t in (self, exponent)]
        res = self if mode == "inplace" else table.output(out, shape, out.dtype if out is not None
                                                          else dtype)
        table.run("pow_tensor", views, [res], "aten.pow_" if mode == "inplace" else "aten.pow")
        return res
    return kernel


def _scatter(op: str, mode: str, kind: str):
    """kind: 'src' (tensor source), 'value' (scalar source), 'add' (scatter_add)."""
    name = f"aten.{op}" + ("_" if mode == "inplace" else "")

    def kernel(self, dim, index, src, *, reduce=None, out=None):
        if not table.ok(self, index) or index.dtype not in (torch.int64, torch.int32):
            return None
        if kind != "value" and not table.ok(src):
            return None
        d = int(dim) % max(self.dim(), 1)
        res = self if mode == "inplace" else table.output(out, self.shape, self.dtype)
        ins = [self, index] + ([src] if kind != "value" else [])
        params = {"dim": d}
        if kind == "value":
            params["value"] = src.item() if isinstance(src, torch.Tensor) else src
        if reduce is not None:
            params["reduce"] = reduce
        table.run("scatter_add" if kind == "add" else "scatter", ins, [res], name, **params)
        return res
    return kernel


def _sign(mode: str):
    def kernel(self, *, out=None):
        if not table.ok(self) or self.dtype == torch.bool:
            return None
        res = self if mode == "inplace" else table.output(out, self.shape, self.dtype)
        table.run("sign", [self], [res], "aten.sign")
        return res
    return kernel


def logit(self, eps=None, *, out=None):
    if not table.ok(self) or self.dtype == torch.bool:
        return None
    dtype = self.dtype if self.dtype.is_floating_point else torch.get_default_dtype()
    res = table.output(out, self.shape, out.dtype if out is not None else dtype)
    table.run("logit", [self], [res], "aten.logit", eps=None if eps is None else float(eps))
    return res


# --- matmul-shaped ops on the GEMM design ------------------------------------------------------
# integer operands pass through the GEMM reference unrounded (exact, as mm on int64); int8 has
# its own int32-accumulating semantics on the array, so those go to the policy here
_GEMM_DTYPES = table.FLOATS + (torch.int16, torch.int32, torch.int64)


def _float_gemm_ok(*ts, alpha=1, beta=1) -> bool:
    ok = all(isinstance(t, torch.Tensor) and t.device.type == "xdna" and
             t.dtype in _GEMM_DTYPES for t in ts)
    if ok and not ts[0].dtype.is_floating_point:    # PyTorch's integer scaling rules: the host
        ok = isinstance(alpha, int) and isinstance(beta, int)
    return ok


def baddbmm(self, batch1, batch2, *, beta=1, alpha=1, out=None):
    _check_mm("baddbmm", batch1, batch2)
    if not _float_gemm_ok(self, batch1, batch2, alpha=alpha, beta=beta):
        return None
    b, m, k = batch1.shape
    n = batch2.shape[2]
    res = _out_for_gemm(batch1, (b, m, n), out)
    if not res.numel():
        return res
    if beta == 0:                 # PyTorch ignores `self` (even NaN/inf in it) when beta == 0
        design = design_for(GemmDesign, m, k, n, batch=b, dtype=_gemm_dtype(batch1, batch2),
                            out_dtype=res.dtype, alpha=float(alpha))
        launch(design, [batch1, batch2], [res], "aten.baddbmm")
        return res
    bias = self.expand(b, m, n)
    design = design_for(GemmDesign, m, k, n, batch=b, dtype=_gemm_dtype(batch1, batch2),
                        out_dtype=res.dtype, bias=True, alpha=float(alpha), beta=float(beta))
    launch(design, [batch1, batch2, bias], [res], "aten.baddbmm")
    return res


def baddbmm_(self, batch1, batch2, *, beta=1, alpha=1):
    return baddbmm(self, batch1, batch2, beta=beta, alpha=alpha, out=self)


def addmv(self, mat, vec, *, beta=1, alpha=1, out=None):
    """out = beta * self + alpha * mat @ vec: a GEMV (n = 1), `self` as the bias column."""
    if not _float_gemm_ok(*(t for t in (mat, vec, self) if t is not None), alpha=alpha,
                          beta=beta):
        return None
    if mat.dim() != 2 or vec.dim() != 1 or mat.shape[1] != vec.shape[0]:
        raise RuntimeError(f"xdna mv: size mismatch, got input ({list(mat.shape)}) and vec "
                           f"({list(vec.shape)})")
    m, k = mat.shape
    res = _out_for_gemm(mat, (m,), out)
    if not m:
        return res
    col = res.view(m, 1) if res.is_contiguous() else None
    target = col if col is not None else storage.empty([m, 1], res.dtype)
    if beta == 0:
        design = design_for(GemmDesign, m, k, 1, out_dtype=res.dtype, alpha=float(alpha))
        launch(design, [mat, vec.view(k, 1)], [target], "aten.addmv")
    else:
        design = design_for(GemmDesign, m, k, 1, out_dtype=res.dtype, bias=True,
                            alpha=float(alpha), beta=float(beta))
        launch(design, [mat, vec.view(k, 1), self.expand(m).view(m, 1)], [target], "aten.addmv")
    if col is None:
        res.copy_(target.view(m))
    return res


def addmv_(self, mat, vec, *, beta=1, alpha=1):
    return addmv(self, mat, vec, beta=beta, alpha=alpha, out=self)


def mv(self, vec, *, out=None):
    return addmv(None, self, vec, beta=0, out=out)


def dot(self, tensor, *, out=None):
    """A 1 x K x 1 GEMV: bf16 operands, fp32 accumulation."""
    if not _float_gemm_ok(self, tensor):
        return None
    if self.dim() != 1 or tensor.dim() != 1 or self.shape[0] != tensor.shape[0]:
        raise RuntimeError(f"xdna dot: 1D tensors of the same size expected, got "
                           f"{list(self.shape)} and {list(tensor.shape)}")
    if self.dtype != tensor.dtype:
        raise RuntimeError(f"xdna dot: expected both vectors to have the same dtype, got "
                           f"{self.dtype} and {tensor.dtype}")
    k = self.shape[0]
    res = table.output(out, (), self.dtype)
    design = design_for(GemmDesign, 1, k, 1, out_dtype=res.dtype)
    launch(design, [self.view(1, k), tensor.view(k, 1)], [res.view(1, 1)], "aten.dot")
    return res


def register_ops(reg: Callable) -> None:
    for op in ("tril", "triu"):
        reg(getattr(aten, op).default, _tri(op, "functional"))
        reg(getattr(aten, op).out, _tri(op, "out"))
        reg(getattr(aten, op + "_").default, _tri(op, "inplace"))
    for op in ("clamp", "clamp_min", "clamp_max"):
        reg(getattr(aten, op).Tensor, _clamp_tensor(op, "functional"))
        reg(getattr(aten, op).Tensor_out, _clamp_tensor(op, "out"))
        reg(getattr(aten, op + "_").Tensor, _clamp_tensor(op, "inplace"))
    reg(aten.pow.Tensor_Tensor, _pow_tensor("functional"))
    reg(aten.pow.Tensor_Tensor_out, _pow_tensor("out"))
    reg(aten.pow_.Tensor, _pow_tensor("inplace"))
    reg(aten.pow.Scalar, _pow_tensor("functional"))
    reg(aten.pow.Scalar_out, _pow_tensor("out"))
    for ov, kind in (("src", "src"), ("value", "value"), ("reduce", "src"),
                     ("value_reduce", "value")):
        reg(getattr(aten.scatter, ov), _scatter("scatter", "functional", kind))
        reg(getattr(aten.scatter_, ov), _scatter("scatter", "inplace", kind))
        reg(getattr(aten.scatter, ov + "_out"), _scatter("scatter", "out", kind))
    reg(aten.scatter_add.default, _scatter("scatter_add", "functional", "add"))
    reg(aten.scatter_add.out, _scatter("scatter_add", "out", "add"))
    reg(aten.scatter_add_.default, _scatter("scatter_add", "inplace", "add"))
    reg(aten.baddbmm.default, baddbmm)
    reg(aten.baddbmm.out, baddbmm)
    reg(aten.baddbmm_.default, baddbmm_)
    reg(aten.addmv.default, addmv)
    reg(aten.addmv.out, addmv)
    reg(aten.addmv_.default, addmv_)
    reg(aten.mv.default, mv)
    reg(aten.mv.out, mv)
    reg(aten.dot.default, dot)
    reg(aten.dot.out, dot)
    for op in ("sign", "sgn"):
        reg(getattr(aten, op).default, _sign("functional"))
        reg(getattr(aten, op).out, _sign("out"))
        reg(getattr(aten, op + "_").default, _sign("inplace"))
    reg(aten.logit.default, logit)
    reg(aten.logit.out, logit)
