"""The op table: aten ops on xdna tensors -> one Launch of an NPU design each.

Each kernel resolves dtypes and shapes, allocates the output, and runs one design through the
runtime, so it is counted, costed and traced. Ops not listed here reach the fallback policy.
Host-side initialisation (fill, RNG, arange) writes the BO directly: on XDNA a BO is host memory,
so that is a host write plus a sync, not a kernel and not a fallback.
"""
from __future__ import annotations

import importlib
import math
from typing import Callable, Sequence

import torch

from torch_xdna.device import fallback, storage
from torch_xdna.kernels import EmbeddingDesign, GemmDesign, VectorDesign
from torch_xdna.kernels.ops.dma import ConcatDesign, GatherDesign
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
    if not any(t.numel() for t in outputs):
        return                  # nothing to write (zero-size result): no launch, as on the CPU
    arg = storage.arg
    get_device().run(Launch(design, [arg(t) for t in inputs], [arg(t) for t in outputs], scalars,
                            op=op))


def scalar_tensor(value, dtype: torch.dtype) -> torch.Tensor:
    """A cached 0-dim xdna tensor holding a Python scalar (read-only, internal)."""
    # keyed by type and value: float() would merge distinct large ints, and NaN != NaN
    key = (type(value), value if value == value else "nan", dtype)
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


_COMPUTE = frozenset(COMPUTE_DTYPES)


def _supported(op_name: str, tensors, args, kwargs) -> bool:
    """True when the NPU kernel handles these dtypes; else apply the fallback policy."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype not in _COMPUTE:
            return False
    return True


def _result_dtype(self: torch.Tensor, other) -> torch.dtype:
    """torch.result_type, with the common cases (same-dtype tensors; a float tensor and a Python
    number) answered without the call."""
    d = self.dtype
    if isinstance(other, torch.Tensor):
        if other.dtype is d:
            return d
    elif d.is_floating_point and isinstance(other, (int, float)):
        return d
    return torch.result_type(self, other)


# --- elementwise ----------------------------------------------------------------------------
def _vector(op: str, inputs: list[torch.Tensor], out_dtype: torch.dtype, out: torch.Tensor | None,
            aten_name: str, inplace: bool = False, **params) -> torch.Tensor:
    shape = inputs[0].shape
    same = True
    for t in inputs[1:]:
        if t.shape != shape:
            same = False
            shape = torch.broadcast_shapes(*[t.shape for t in inputs])
            break
    shape = tuple(shape)
    out_arg = None
    if out is None:
        out, out_arg = storage.empty_with_arg(shape, out_dtype)
    elif out.shape != shape:
        if inplace:
            raise RuntimeError(f"xdna {aten_name}: output with shape {list(out.shape)} doesn't "
                               f"match the broadcast shape {list(shape)}")
        out.resize_(shape)
    if same:
        views, in_shapes = inputs, (shape,) * len(inputs)
    else:
        views = [t if t.shape == shape else t.expand(shape) for t in inputs]
        in_shapes = tuple(tuple(t.shape) for t in inputs)
    if 0 in shape:
        return out              # zero-size result: nothing to compute
    design = design_for(VectorDesign, op, in_shapes, tuple(t.dtype for t in inputs), shape,
                        out.dtype, tuple(sorted(params.items())) if params else ())
    arg = storage.arg
    get_device().run(Launch(design, [arg(t) for t in views], [out_arg or arg(out)], {},
                            op=aten_name))
    return out


def _binary_kernel(op: str, aten_name: str, mode: str):
    """mode: 'functional' | 'inplace' | 'out'."""
    def kernel(self, other, *, alpha=1, out=None):
        # a number (or CPU 0-dim tensor) as self: `2.0 - x` arrives as sub(2.0, x)
        scalar_self = mode != "inplace" and _is_xdna(other) and (
            isinstance(self, (int, float, bool)) or
            (isinstance(self, torch.Tensor) and self.dim() == 0 and not _is_xdna(self)))
        if not (_is_xdna(self) or scalar_self) or not _supported(aten_name, (self, other), (), {}):
            return None
        dtype = _result_dtype(self, other) if not scalar_self else torch.result_type(other, self)
        if op == "div" and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        a = self if not scalar_self else as_device_operand(self, dtype)
        b = as_device_operand(other, dtype if not isinstance(other, torch.Tensor) else other.dtype)
        params = {"alpha": alpha} if alpha != 1 else {}
        if mode == "inplace":
            return _vector(op, [a, b], self.dtype, self, aten_name, inplace=True, **params)
        return _vector(op, [a, b], out.dtype if out is not None else dtype, out, aten_name, **params)
    return kernel


def _unary_kernel(op: str, aten_name: str, mode: str):
    def kernel(self, *args, out=None, **kw):
        if self.dtype not in _COMPUTE:
            return None
        params = {}
        if op == "gelu" and (kw.get("approximate", args[0] if args else "none") == "tanh"):
            op_ = "gelu_tanh"
        else:
            op_ = op
        dtype = self.dtype
        if op_ in FLOAT_RESULT and not dtype.is_floating_point:
            dtype = torch.get_default_dtype()
        if mode == "inplace":
            return _vector(op_, [self], self.dtype, self, aten_name, inplace=True, **params)
        return _vector(op_, [self], out.dtype if out is not None else dtype, out, aten_name, **params)
    return kernel


FLOAT_RESULT = frozenset({"exp", "rsqrt", "sqrt", "sigmoid", "tanh", "sin", "cos", "erf",
                          "reciprocal", "log"})


def _integral(t) -> bool:
    return not (t.dtype.is_floating_point if isinstance(t, torch.Tensor) else isinstance(t, float))


def _binary_bool_kernel(op: str, aten_name: str, mode: str):
    """Comparisons, logical and bitwise ops: bool results (bitwise: the promoted integer dtype)."""
    bitwise = op.startswith("bitwise_")

    def kernel(self, other, *, out=None):
        if not _is_xdna(self) or not _supported(aten_name, [self, other], (), {}):
            return None
        if bitwise and not (_integral(self) and _integral(other)):
            return None      # the host raises torch's own error for float bitwise operands
        dtype = torch.result_type(self, other)
        b = as_device_operand(other, dtype if not isinstance(other, torch.Tensor) else other.dtype)
        res_dtype = dtype if bitwise else torch.bool
        if mode == "inplace":
            return _vector(op, [self, b], self.dtype, self, aten_name, inplace=True)
        return _vector(op, [self, b], out.dtype if out is not None else res_dtype, out, aten_name)
    return kernel


def _predicate_kernel(op: str, aten_name: str, mode: str):
    """Unary ops with a bool (logical_not, is*) or same-dtype (abs, bitwise_not) result."""
    def kernel(self, *, out=None):
        if not _supported(aten_name, [self], (), {}):
            return None
        if op == "bitwise_not" and not _integral(self):
            return None
        dtype = self.dtype if op in ("abs", "bitwise_not") else torch.bool
        if mode == "inplace":
            return _vector(op, [self], self.dtype, self, aten_name, inplace=True)
        return _vector(op, [self], out.dtype if out is not None else dtype, out, aten_name)
    return kernel


def _pow_kernel(mode: str):
    def kernel(self, exponent, *, out=None):
        if not _supported("aten.pow", [self], (), {}) or isinstance(exponent, (complex, torch.Tensor)):
            return None
        dtype = torch.result_type(self, exponent)
        if not dtype.is_floating_point and exponent < 0:
            return None      # integers to negative powers: the host raises torch's error
        op, params = ("square", {}) if exponent == 2 else ("pow", {"exponent": exponent})
        name = "aten.pow_" if mode == "inplace" else "aten.pow"
        if mode == "inplace":
            return _vector(op, [self], self.dtype, self, name, inplace=True, **params)
        return _vector(op, [self], out.dtype if out is not None else dtype, out, name, **params)
    return kernel


def clamp_bounds(which: str, args, kw) -> tuple:
    """(lo, hi) of clamp / clamp_min / clamp_max from their positional or keyword arguments."""
    if which == "clamp":
        return (args[0] if args else kw.get("min")), (args[1] if len(args) > 1 else kw.get("max"))
    if which == "clamp_min":
        return (args[0] if args else kw["min"]), None
    return None, (args[0] if args else kw["max"])


def _clamp_kernel(which: str, mode: str):
    """clamp / clamp_min / clamp_max with scalar bounds (a compare-select: exact)."""
    def kernel(self, *args, out=None, **kw):
        lo, hi = clamp_bounds(which, args, kw)
        if not _supported("aten.clamp", [self], (), {}) or isinstance(lo, torch.Tensor) \
                or isinstance(hi, torch.Tensor):
            return None
        if lo is None and hi is None:
            raise RuntimeError("xdna clamp: at least one of 'min' or 'max' must not be None")
        dtype = self.dtype
        if not dtype.is_floating_point and any(isinstance(v, float) for v in (lo, hi)):
            dtype = torch.get_default_dtype()
        name = f"aten.{which}_" if mode == "inplace" else f"aten.{which}"
        params = {"min": lo, "max": hi}
        if mode == "inplace":
            return _vector("clamp", [self], self.dtype, self, name, inplace=True, **params)
        return _vector("clamp", [self], out.dtype if out is not None else dtype, out, name,
                       **params)
    return kernel


def _masked_fill_kernel(mode: str):
    """masked_fill as a select: where(mask, value, self)."""
    def kernel(self, mask, value, *, out=None):
        if not _supported("aten.masked_fill", [self, mask, value], (), {}) \
                or mask.dtype != torch.bool:
            return None
        v = as_device_operand(value, self.dtype)
        if mode == "inplace":
            return _vector("where", [mask, v, self], self.dtype, self, "aten.masked_fill_",
                           inplace=True)
        return _vector("where", [mask, v, self], out.dtype if out is not None else self.dtype,
                       out, "aten.masked_fill")
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


def where(cond, self, other, *, out=None):
    dtype = torch.result_type(self, other)
    a = as_device_operand(self, dtype)
    b = as_device_operand(other, dtype)
    c = as_device_operand(cond, torch.bool)
    return _vector("where", [c, a, b], out.dtype if out is not None else dtype, out, "aten.where")


def _bool_reduce(op: str):
    """all / any over all elements or some dims (bool out; uint8 stays uint8, as in torch)."""
    aten_name = f"aten.{op}"

    def kernel(self, dim=None, keepdim=False, *, out=None):
        if not _supported(aten_name, [self], (), {}):
            return None
        if dim is not None and not isinstance(dim, (list, tuple)):
            dim = [dim]
        nd = max(self.dim(), 1)
        dims = tuple(sorted({d % nd for d in dim})) if dim else ()
        if dims and self.dim():
            shape = [1 if i in dims else s for i, s in enumerate(self.shape)] if keepdim else \
                [s for i, s in enumerate(self.shape) if i not in dims]
        else:
            shape = [1] * self.dim() if keepdim else []
        res_dtype = torch.uint8 if self.dtype == torch.uint8 else torch.bool
        res = _out_of(out, shape, res_dtype)
        design = design_for(VectorDesign, op, (tuple(self.shape),), (self.dtype,), tuple(shape),
                            res.dtype, (("dims", dims), ("keepdim", bool(keepdim))))
        launch(design, [self], [res], aten_name)
        return res
    return kernel


def _out_of(out: torch.Tensor | None, shape, dtype: torch.dtype) -> torch.Tensor:
    """The output tensor: a fresh one, or `out` resized to `shape` (structured .out calls)."""
    if out is None:
        return storage.empty(shape, dtype)
    if tuple(out.shape) != tuple(shape):
        out.resize_(shape)
    return out


def cumsum(self, dim, *, dtype=None, out=None):
    if not _supported("aten.cumsum", [self], (), {}):
        return None
    res_dtype = dtype or (self.dtype if self.dtype.is_floating_point else torch.int64)
    res = _out_of(out, self.shape, res_dtype)
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


# --- data movement: concatenation and gathers (DMA only) ----------------------------------------
def cat(tensors, dim=0, *, out=None):
    if any(not _is_xdna(t) for t in tensors):
        bad = next(t for t in tensors if not _is_xdna(t))
        raise RuntimeError(f"xdna cat: expected all tensors on 'xdna', got a {bad.device} tensor of "
                           f"shape {list(bad.shape)}; move it with .to('xdna')")
    if not _supported("aten.cat", tensors, (), {}):
        return None
    # legacy rule: 1-D empty tensors are skipped whatever the other shapes are
    parts = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if not parts:
        return _out_of(out, (0,), dtype)
    ref = parts[0]
    d = dim % ref.dim() if ref.dim() else 0
    for t in parts:
        if t.dim() != ref.dim() or any(a != b for i, (a, b) in enumerate(zip(t.shape, ref.shape))
                                       if i != d):
            raise RuntimeError(f"xdna cat: sizes of tensors must match except in dimension {d}; "
                               f"got {list(ref.shape)} and {list(t.shape)}")
    shape = list(ref.shape)
    shape[d] = sum(t.shape[d] for t in parts)
    res = _out_of(out, shape, out.dtype if out is not None else dtype)
    if res.numel():
        # a DMA moves bytes and cannot convert: mixed dtypes are converted first (counted copies)
        parts = [t if t.dtype == res.dtype else t.to(res.dtype) for t in parts]
        design = design_for(ConcatDesign, tuple(tuple(t.shape) for t in parts), res.dtype, d,
                            tuple(shape))
        launch(design, parts, [res], "aten.cat")
    return res


def _gather_launch(mode: str, src: torch.Tensor, idx: list[torch.Tensor], shape, out, params,
                   aten_name: str) -> torch.Tensor:
    res = _out_of(out, shape, out.dtype if out is not None else src.dtype)
    if res.numel():
        design = design_for(GatherDesign, mode, (tuple(src.shape),) + tuple(tuple(i.shape) for i in idx),
                            src.dtype, tuple(shape), tuple(sorted(params.items())))
        launch(design, [src] + idx, [res], aten_name)
    return res


def _index_ok(name: str, src, idx) -> bool:
    return _supported(name, [src, idx], (), {}) and _is_xdna(idx) and \
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
    if out is None and _is_xdna(self) and _is_xdna(index) and index.numel() == 0:
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
    reg(aten.where.self_out, where)
    _rsub = _binary_kernel("sub", "aten.rsub", "functional")
    reg(aten.rsub.Tensor, lambda self, other, *, alpha=1: _rsub(other, self, alpha=alpha))
    _register_more(reg)
    for module in EXTRA_OP_MODULES:
        try:
            mod = importlib.import_module(f"torch_xdna.device.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"torch_xdna.device.{module}":
                raise
            continue                    # family not built yet
        mod.register_ops(reg)
    return covered


# op families kept in their own modules; each exposes `register_ops(reg)`
EXTRA_OP_MODULES = ("ops_conv", "ops_reduce", "ops_train", "ops_misc")


COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")
LOGICAL = ("logical_and", "logical_or", "logical_xor")
PREDICATES = ("isnan", "isinf", "isneginf", "isposinf", "abs", "bitwise_not", "logical_not")
MORE_UNARY = ("sin", "cos", "erf", "reciprocal", "log")


def _register_more(reg: Callable) -> None:
    """Comparisons, logic, predicates, pow/clamp/masked_fill, bool reductions, scans, cat and
    gathers: the ops small HF models hit around masks, RoPE and norms."""
    for name in COMPARE + BITWISE:
        packet, inplace = getattr(aten, name), getattr(aten, name + "_")
        for ov in ("Tensor", "Scalar"):
            reg(getattr(packet, ov), _binary_bool_kernel(name, f"aten.{name}", "functional"))
            reg(getattr(packet, ov + "_out"), _binary_bool_kernel(name, f"aten.{name}", "out"))
            reg(getattr(inplace, ov), _binary_bool_kernel(name, f"aten.{name}_", "inplace"))
    for name in LOGICAL:
        packet, inplace = getattr(aten, name), getattr(aten, name + "_")
        reg(packet.default, _binary_bool_kernel(name, f"aten.{name}", "functional"))
        reg(packet.out, _binary_bool_kernel(name, f"aten.{name}", "out"))
        reg(inplace.default, _binary_bool_kernel(name, f"aten.{name}_", "inplace"))
    for name in PREDICATES:
        packet, inplace = getattr(aten, name), getattr(aten, name + "_", None)
        reg(packet.default, _predicate_kernel(name, f"aten.{name}", "functional"))
        reg(packet.out, _predicate_kernel(name, f"aten.{name}", "out"))
        if inplace is not None:
            reg(inplace.default, _predicate_kernel(name, f"aten.{name}_", "inplace"))
    for name in MORE_UNARY:
        packet = getattr(aten, name)
        reg(packet.default, _unary_kernel(name, f"aten.{name}", "functional"))
        reg(packet.out, _unary_kernel(name, f"aten.{name}", "out"))
        reg(getattr(aten, name + "_").default, _unary_kernel(name, f"aten.{name}_", "inplace"))
    reg(aten.pow.Tensor_Scalar, _pow_kernel("functional"))
    reg(aten.pow.Tensor_Scalar_out, _pow_kernel("out"))
    reg(aten.pow_.Scalar, _pow_kernel("inplace"))
    for name in ("clamp", "clamp_min", "clamp_max"):
        reg(getattr(aten, name).default, _clamp_kernel(name, "functional"))
        reg(getattr(aten, name).out, _clamp_kernel(name, "out"))
        reg(getattr(aten, name + "_").default, _clamp_kernel(name, "inplace"))
    for ov in ("Scalar", "Tensor"):
        reg(getattr(aten.masked_fill, ov), _masked_fill_kernel("functional"))
        reg(getattr(aten.masked_fill, ov + "_out"), _masked_fill_kernel("out"))
        reg(getattr(aten.masked_fill_, ov), _masked_fill_kernel("inplace"))
    for name in ("all", "any"):
        k = _bool_reduce(name)
        for ov in ("default", "dim", "dims", "out", "dims_out", "all_out"):
            reg(getattr(getattr(aten, name), ov), k)
    reg(aten.cumsum.default, cumsum)
    reg(aten.cumsum.out, cumsum)
    reg(aten.cumsum_.default, cumsum_)
    reg(aten.cat.default, cat)
    reg(aten.cat.out, cat)
    reg(aten.index_select.default, index_select)
    reg(aten.index_select.out, index_select)
    reg(aten.gather.default, gather)
    reg(aten.gather.out, gather)
    reg(aten.index.Tensor, index)
    reg(aten.index.Tensor_out, index)
