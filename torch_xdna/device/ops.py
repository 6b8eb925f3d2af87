"""The op table: aten ops on xdna tensors -> one Launch of an NPU design each.

Each kernel resolves dtypes and shapes, allocates the output, and runs one design through the
runtime, so it is counted, costed and traced. Ops not listed here reach the fallback policy.
Host-side initialisation (fill, RNG, arange) writes the BO directly: on XDNA a BO is host memory,
so that is a host write plus a sync, not a kernel and not a fallback.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from torch_xdna.device import fallback, storage
from torch_xdna.kernels import EmbeddingDesign, GemmDesign, VectorDesign
from torch_xdna.kernels.numerics import dtype_name
from torch_xdna.runtime import Launch, PlanError, get_device

aten = torch.ops.aten
COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8,
                  torch.int16, torch.int32, torch.int64, torch.bool)
FLOAT_COMPUTE = (torch.float32, torch.bfloat16, torch.float16)

_scalar_cache: dict[tuple, torch.Tensor] = {}
_designs: dict[tuple, object] = {}


def design_for(cls, *args, **kwargs):
    """Intern designs: the same op on the same shapes reuses one instance (and its cached key),
    which keeps the eager hot path free of re-hashing and re-planning."""
    k = (cls, args, tuple(kwargs.items()))
    d = _designs.get(k)
    if d is None:
        d = _designs[k] = cls(*args, **kwargs)
    return d


def _is_xdna(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "xdna"


def launch(design, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op: str,
           **scalars) -> None:
    get_device().run(Launch(design, [storage.arg(t) for t in inputs],
                            [storage.arg(t) for t in outputs], scalars, op=op))


def scalar_tensor(value, dtype: torch.dtype) -> torch.Tensor:
    """A cached 0-dim xdna tensor holding a Python scalar (read-only, internal)."""
    key = (float(value) if not isinstance(value, bool) else value, dtype)
    t = _scalar_cache.get(key)
    if t is None:
        t = storage.empty([], dtype)
        storage.host_view(t, for_write=True).fill_(value)
        _scalar_cache[key] = t
    return t


def as_device_operand(x, dtype: torch.dtype) -> torch.Tensor:
    if _is_xdna(x):
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            return scalar_tensor(x.item(), dtype)
        raise RuntimeError(f"xdna: expected all tensors on 'xdna', got a {x.device} tensor of shape "
                           f"{list(x.shape)}; move it with .to('xdna')")
    return scalar_tensor(x, dtype)


def _supported(op_name: str, tensors, args, kwargs) -> bool:
    """True when the NPU kernel handles these dtypes; else apply the fallback policy."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype not in COMPUTE_DTYPES:
            return False
    return True


# --- elementwise ----------------------------------------------------------------------------
def _vector(op: str, inputs: list[torch.Tensor], out_dtype: torch.dtype, out: torch.Tensor | None,
            aten_name: str, **params) -> torch.Tensor:
    shape = inputs[0].shape
    if any(t.shape != shape for t in inputs[1:]):
        shape = torch.broadcast_shapes(*[t.shape for t in inputs])
    if out is None:
        out = storage.empty(shape, out_dtype)
    elif tuple(out.shape) != tuple(shape):
        out.resize_(shape)
    views = [t.expand(shape) if tuple(t.shape) != tuple(shape) else t for t in inputs]
    design = design_for(VectorDesign, op, tuple(tuple(t.shape) for t in inputs),
                        tuple(t.dtype for t in inputs), tuple(shape), out.dtype,
                        tuple(sorted(params.items())))
    launch(design, views, [out], aten_name)
    return out


def _binary_kernel(op: str, aten_name: str, mode: str):
    """mode: 'functional' | 'inplace' | 'out'."""
    def kernel(self, other, *, alpha=1, out=None):
        if not _is_xdna(self) or not _supported(aten_name, [self, other], (), {}):
            return None
        dtype = torch.result_type(self, other)
        if op == "div" and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        a = self
        b = as_device_operand(other, dtype if not isinstance(other, torch.Tensor) else other.dtype)
        params = {"alpha": alpha} if alpha != 1 else {}
        if mode == "inplace":
            return _vector(op, [a, b], self.dtype, self, aten_name, **params)
        return _vector(op, [a, b], out.dtype if out is not None else dtype, out, aten_name, **params)
    return kernel


def _unary_kernel(op: str, aten_name: str, mode: str):
    def kernel(self, *args, out=None, **kw):
        if not _supported(aten_name, [self], (), {}):
            return None
        params = {}
        if op == "gelu" and (kw.get("approximate", args[0] if args else "none") == "tanh"):
            op_ = "gelu_tanh"
        else:
            op_ = op
        dtype = self.dtype
        if op_ in ("exp", "rsqrt", "sqrt", "sigmoid", "tanh") and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        if mode == "inplace":
            return _vector(op_, [self], self.dtype, self, aten_name, **params)
        return _vector(op_, [self], out.dtype if out is not None else dtype, out, aten_name, **params)
    return kernel


# --- matmul family ---------------------------------------------------------------------------
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
    dtype = torch.int32 if a.dtype == torch.int8 else a.dtype
    if out is None:
        return storage.empty(shape, dtype)
    if tuple(out.shape) != tuple(shape):
        out.resize_(shape)
    return out


def mm(self, mat2, *, out=None):
    _check_mm("mm", self, mat2)
    if not _supported("aten.mm", [self, mat2], (), {}):
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


# --- rows: softmax, norms, reductions, gather --------------------------------------------------
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


def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    res = storage.empty(tuple(indices.shape) + (weight.shape[1],), weight.dtype)
    idx = indices.reshape(-1)
    design = design_for(EmbeddingDesign, weight.shape[0], weight.shape[1], idx.numel(), weight.dtype)
    launch(design, [weight, idx], [res.view(idx.numel(), weight.shape[1])], "aten.embedding")
    return res


def where(cond, self, other):
    dtype = torch.result_type(self, other)
    a = as_device_operand(self, dtype)
    b = as_device_operand(other, dtype)
    c = as_device_operand(cond, torch.bool)
    return _vector("where", [c, a, b], dtype, None, "aten.where")


# --- registration ----------------------------------------------------------------------------
def _guard(fn: Callable, op: torch._ops.OpOverload, name: str):
    """Wrap a kernel: unsupported dtypes (kernel returns None) go to the fallback policy."""
    def kernel(*args, **kwargs):
        try:
            res = fn(*args, **kwargs)
        except PlanError as e:
            fallback.note(name, args, kwargs, why=f"does not fit the NPU array ({e})")
            return fallback.run_on_host(op, args, kwargs)
        if res is None:
            fallback.note(name, args, kwargs)
            return fallback.run_on_host(op, args, kwargs)
        return res
    return kernel


def _out_variant(fn: Callable):
    return lambda *args, out, **kw: fn(*args, out=out, **kw)


BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div",
          "maximum": "maximum", "minimum": "minimum"}
UNARY = {"relu": "relu", "gelu": "gelu", "silu": "silu", "sigmoid": "sigmoid", "tanh": "tanh",
         "exp": "exp", "rsqrt": "rsqrt", "sqrt": "sqrt", "neg": "neg"}


def register(lib: torch.library.Library) -> list[str]:
    """Register every NPU kernel for the PrivateUse1 key; returns the aten names covered."""
    covered = []

    def reg(overload: torch._ops.OpOverload, fn: Callable) -> None:
        name = overload._schema.name.replace("::", ".")
        if overload._overloadname != "default":
            name += "." + overload._overloadname
        lib.impl(overload, _guard(fn, overload, name), "PrivateUse1")
        covered.append(name)

    for name, op in BINARY.items():
        packet = getattr(aten, name)
        inplace = getattr(aten, name + "_", None)
        for ov in ("Tensor", "Scalar"):
            if ov in packet.overloads():
                reg(getattr(packet, ov), _binary_kernel(op, f"aten.{name}", "functional"))
            if inplace is not None and ov in inplace.overloads():
                reg(getattr(inplace, ov), _binary_kernel(op, f"aten.{name}_", "inplace"))
        if "default" in packet.overloads():
            reg(packet.default, _binary_kernel(op, f"aten.{name}", "functional"))
        if "out" in packet.overloads():
            reg(packet.out, _binary_kernel(op, f"aten.{name}", "out"))
    for name, op in UNARY.items():
        packet = getattr(aten, name)
        reg(packet.default, _unary_kernel(op, f"aten.{name}", "functional"))
        inplace = getattr(aten, name + "_", None)
        if inplace is not None:
            reg(inplace.default, _unary_kernel(op, f"aten.{name}_", "inplace"))
        if "out" in packet.overloads():
            reg(packet.out, _unary_kernel(op, f"aten.{name}", "out"))
    reg(aten.mm.default, mm)
    reg(aten.mm.out, mm)
    reg(aten.addmm.default, addmm)
    reg(aten.addmm.out, addmm)
    reg(aten.bmm.default, bmm)
    reg(aten.bmm.out, bmm)
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
    reg(aten.embedding.default, embedding)
    reg(aten.where.self, where)
    return covered
