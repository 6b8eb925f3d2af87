"""The matmul family on the GEMM design: mm, addmm, bmm, and the matmul-shaped baddbmm, addmv,
mv and dot (GEMV: n = 1). One launch each."""
from __future__ import annotations

from typing import Callable

import torch

from torch_xdna.device import storage
from torch_xdna.device.kernel import (FLOAT_COMPUTE, design_for, launch, output_tensor,
                                      supported_dtypes)
from torch_xdna.kernels import GemmDesign

aten = torch.ops.aten


def _gemm_dtype(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype == torch.int8 and b.dtype == torch.int8:
        return "int8"
    return "bf16"


def _check_mm(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"xdna {name}: shapes {list(a.shape)} and {list(b.shape)} cannot be "
                           f"multiplied ({a.shape[-1]} != {b.shape[-2]})")
    if a.dtype != b.dtype:
        raise RuntimeError(f"xdna {name}: expected both operands of one dtype, got {a.dtype} "
                           f"and {b.dtype}")


def _out_for_gemm(a: torch.Tensor, shape, out: torch.Tensor | None) -> torch.Tensor:
    """The result: int8 GEMMs accumulate to int32, others keep the operands' dtype."""
    return output_tensor(out, shape, torch.int32 if a.dtype == torch.int8 else a.dtype)


def mm(self, mat2, *, out=None):
    _check_mm("mm", self, mat2)
    if not supported_dtypes([self, mat2]):
        return None
    m, k = self.shape
    n = mat2.shape[1]
    res = _out_for_gemm(self, (m, n), out)
    if m and n:
        if k == 0:
            res.zero_()
        else:
            launch(design_for(GemmDesign, m, k, n, dtype=_gemm_dtype(self, mat2),
                              out_dtype=res.dtype), [self, mat2], [res], "aten.mm")
    return res


def addmm(self, mat1, mat2, *, beta=1, alpha=1, out=None):
    _check_mm("addmm", mat1, mat2)
    m, k = mat1.shape
    n = mat2.shape[1]
    res = _out_for_gemm(mat1, (m, n), out)
    if not (m and n):
        return res
    bias = self.expand(m, n) if self.dim() < 2 or tuple(self.shape) != (m, n) else self
    design = design_for(GemmDesign, m, k, n, dtype=_gemm_dtype(mat1, mat2), out_dtype=res.dtype,
                        bias=True, alpha=float(alpha), beta=float(beta))
    launch(design, [mat1, mat2, bias], [res], "aten.addmm")
    return res


def bmm(self, mat2, *, out=None):
    _check_mm("bmm", self, mat2)
    b, m, k = self.shape
    n = mat2.shape[2]
    res = _out_for_gemm(self, (b, m, n), out)
    if b and m and n:
        if k == 0:
            res.zero_()
        else:
            launch(design_for(GemmDesign, m, k, n, batch=b, dtype=_gemm_dtype(self, mat2),
                              out_dtype=res.dtype), [self, mat2], [res], "aten.bmm")
    return res


# matmul-shaped ops
# integer operands pass through the GEMM reference unrounded (exact, as mm on int64); int8 has
# its own int32-accumulating semantics on the array, so those go to the policy here
_GEMM_DTYPES = FLOAT_COMPUTE + (torch.int16, torch.int32, torch.int64)


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
    res = output_tensor(out, (), self.dtype)
    design = design_for(GemmDesign, 1, k, 1, out_dtype=res.dtype)
    launch(design, [self.view(1, k), tensor.view(k, 1)], [res.view(1, 1)], "aten.dot")
    return res


def register_ops(reg: Callable) -> None:
    for fn in (mm, addmm, bmm, baddbmm, addmv, mv, dot):
        packet = getattr(aten, fn.__name__)
        reg(packet.default, fn)
        reg(packet.out, fn)
    reg(aten.baddbmm_.default, baddbmm_)
    reg(aten.addmv_.default, addmv_)
