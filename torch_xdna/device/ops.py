"""The op table: aten ops on xdna tensors -> one Launch of an NPU design each.

Each kernel resolves dtypes and shapes, allocates the output, and runs one design through the
runtime, so it is counted, costed and traced. Ops not listed here reach the fallback policy.
This module holds the registration (the guard that sends unsupported dtypes and unplannable
shapes to the fallback policy) and the elementwise ops on VectorDesign; the other families live
in the OP_FAMILIES modules (ops_gemm, ops_reduce, ops_select, ops_conv, ops_train), and what
every kernel shares in kernel.py. Host-side initialisation (fill, RNG, arange) writes the BO
directly: on XDNA a BO is host memory, so that is a host write plus a sync, not a kernel and not
a fallback.
"""
from __future__ import annotations

import importlib
from typing import Callable

import torch

from torch_xdna.device import fallback, storage
from torch_xdna.device.kernel import (COMPUTE, as_device_operand, clamp_bounds, design_for, is_xdna,
                                      register_modes, result_dtype, supported_dtypes)
from torch_xdna.kernels import VectorDesign
from torch_xdna.runtime import Launch, PlanError, get_device

aten = torch.ops.aten


# --- elementwise ------------------------------------------------------------------------------
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
        scalar_self = mode != "inplace" and is_xdna(other) and (
            isinstance(self, (int, float, bool)) or
            (isinstance(self, torch.Tensor) and self.dim() == 0 and not is_xdna(self)))
        if not (is_xdna(self) or scalar_self) or not supported_dtypes((self, other)):
            return None
        dtype = result_dtype(self, other) if not scalar_self else torch.result_type(other, self)
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
        if self.dtype not in COMPUTE:
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
        if not is_xdna(self) or not supported_dtypes([self, other]):
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
        if not supported_dtypes([self]):
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
        if not supported_dtypes([self]) or isinstance(exponent, (complex, torch.Tensor)):
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


def _clamp_kernel(which: str, mode: str):
    """clamp / clamp_min / clamp_max with scalar bounds (a compare-select: exact)."""
    def kernel(self, *args, out=None, **kw):
        lo, hi = clamp_bounds(which, args, kw)
        if not supported_dtypes([self]) or isinstance(lo, torch.Tensor) \
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
        if not supported_dtypes([self, mask, value]) \
                or mask.dtype != torch.bool:
            return None
        v = as_device_operand(value, self.dtype)
        if mode == "inplace":
            return _vector("where", [mask, v, self], self.dtype, self, "aten.masked_fill_",
                           inplace=True)
        return _vector("where", [mask, v, self], out.dtype if out is not None else self.dtype,
                       out, "aten.masked_fill")
    return kernel


def where(cond, self, other, *, out=None):
    dtype = torch.result_type(self, other)
    a = as_device_operand(self, dtype)
    b = as_device_operand(other, dtype)
    c = as_device_operand(cond, torch.bool)
    return _vector("where", [c, a, b], out.dtype if out is not None else dtype, out, "aten.where")


# --- registration ------------------------------------------------------------------------------
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
    reg(aten.where.self, where)
    reg(aten.where.self_out, where)
    _rsub = _binary_kernel("sub", "aten.rsub", "functional")
    reg(aten.rsub.Tensor, lambda self, other, *, alpha=1: _rsub(other, self, alpha=alpha))
    _register_more(reg)
    for module in OP_FAMILIES:
        try:
            mod = importlib.import_module(f"torch_xdna.device.{module}")
        except ModuleNotFoundError as e:
            if e.name != f"torch_xdna.device.{module}":
                raise
            continue                    # family not built yet
        mod.register_ops(reg)
    return covered


# op families kept in their own modules; each exposes `register_ops(reg)`
OP_FAMILIES = ("ops_gemm", "ops_reduce", "ops_select", "ops_conv", "ops_train")


COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")
LOGICAL = ("logical_and", "logical_or", "logical_xor")
PREDICATES = ("isnan", "isinf", "isneginf", "isposinf", "abs", "bitwise_not", "logical_not")
MORE_UNARY = ("sin", "cos", "erf", "reciprocal", "log")


def _register_more(reg: Callable) -> None:
    """Comparisons, logic, predicates, pow/clamp/masked_fill: the elementwise ops small HF models
    hit around masks, RoPE and norms."""
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
        register_modes(reg, name, lambda mode, name=name: _unary_kernel(
            name, f"aten.{name}_" if mode == "inplace" else f"aten.{name}", mode))
    reg(aten.pow.Tensor_Scalar, _pow_kernel("functional"))
    reg(aten.pow.Tensor_Scalar_out, _pow_kernel("out"))
    reg(aten.pow_.Scalar, _pow_kernel("inplace"))
    for name in ("clamp", "clamp_min", "clamp_max"):
        register_modes(reg, name, lambda mode, name=name: _clamp_kernel(name, mode))
    for ov in ("Scalar", "Tensor"):
        register_modes(reg, "masked_fill", _masked_fill_kernel, ov)
