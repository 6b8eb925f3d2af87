"""Training ops: activation/softmax/layer-norm backward, losses (nll, mse) and their backward,
embedding backward, and the optimizer arithmetic (addcmul, addcdiv, lerp) that PyTorch's
`_foreach_*` kernels decompose into on this device. One vector-unit launch each
(kernels/ops/train.py); with these an MLP trains under `torch.xdna.strict()`
(tests/test_train_strict.py).
"""
from __future__ import annotations

from typing import Callable

import torch

import torch_xdna.kernels.ops.train  # noqa: F401  (defines the table ops)
from torch_xdna.device import storage
from torch_xdna.device.kernel import (FLOAT_COMPUTE, as_device_operand, design_for, launch,
                                      operands_ok, output_tensor, register_modes, run_table)
from torch_xdna.kernels.ops.foreach import ForeachDesign

aten = torch.ops.aten


def _elementwise_backward(op: str, aten_name: str):
    """(grad_output, saved) -> grad_input, broadcasting as PyTorch's TensorIterator does."""
    def kernel(grad_output, saved, *args, grad_input=None, **params):
        if not operands_ok(grad_output, saved, floats_only=True):
            return None
        if op == "threshold_backward":
            params["threshold"] = args[0] if args else params.pop("threshold")
        elif op == "logit_backward":
            eps = args[0] if args else params.pop("eps", None)
            params["eps"] = None if eps is None else float(eps)
        shape = tuple(torch.broadcast_shapes(grad_output.shape, saved.shape))
        g = grad_output if tuple(grad_output.shape) == shape else grad_output.expand(shape)
        s = saved if tuple(saved.shape) == shape else saved.expand(shape)
        dtype = torch.promote_types(grad_output.dtype, saved.dtype)
        res = output_tensor(grad_input, shape, grad_input.dtype if grad_input is not None else dtype)
        run_table(op, [g, s], [res], aten_name, **params)
        return res
    return kernel


def _softmax_backward(op: str, aten_name: str):
    def kernel(grad_output, output, dim, input_dtype, *, out=None, grad_input=None):
        if not operands_ok(grad_output, output, floats_only=True):
            return None
        out = out if out is not None else grad_input
        res = output_tensor(out, output.shape, input_dtype if out is None else out.dtype)
        if not output.numel():
            return res
        d = dim % max(output.dim(), 1)
        last = output.dim() == 0 or d == output.dim() - 1
        mv = (lambda t: t) if last else (lambda t: t.movedim(d, -1))
        g, o = mv(grad_output), mv(output)
        shape = tuple(o.shape) or (1,)
        tmp = output_tensor(None, shape, res.dtype)
        run_table(op, [g.reshape(shape), o.reshape(shape)], [tmp], aten_name)
        res.copy_(tmp.reshape(output.shape) if last else tmp.movedim(-1, d))
        return res
    return kernel


def layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    if not operands_ok(grad_out, input, mean, rstd, weight, bias, floats_only=True):
        return None
    nd = len(normalized_shape)
    ins = [grad_out, input, mean, rstd] + [t for t in (weight, bias) if t is not None]
    outs = [(input.shape, input.dtype)]
    wshape = tuple(input.shape[input.dim() - nd:])
    outs.append((wshape, weight.dtype if weight is not None else input.dtype))
    outs.append((wshape, bias.dtype if bias is not None else input.dtype))
    gi, gw, gb = run_table("layer_norm_backward", ins, outs, "aten.native_layer_norm_backward",
                           row_dims=nd, has_weight=weight is not None, has_bias=bias is not None)
    return (gi if output_mask[0] else None, gw if output_mask[1] and weight is not None else None,
            gb if output_mask[2] and bias is not None else None)


def _nll_forward(two_d: bool):
    name = "aten.nll_loss2d_forward" if two_d else "aten.nll_loss_forward"

    def kernel(self, target, weight, reduction, ignore_index, *, output=None, total_weight=None):
        if not operands_ok(self, weight, floats_only=True) or not operands_ok(target) \
                or target.dtype not in (torch.int64, torch.int32, torch.uint8):
            return None
        meta = (aten.nll_loss2d_forward if two_d else aten.nll_loss_forward)(
            torch.empty(self.shape, device="meta", dtype=self.dtype),
            torch.empty(target.shape, device="meta", dtype=target.dtype),
            None if weight is None else
            torch.empty(weight.shape, device="meta", dtype=weight.dtype),
            reduction, ignore_index)            # shape checks and result shapes, as PyTorch
        out = output_tensor(output, meta[0].shape, self.dtype)
        tw = output_tensor(total_weight, meta[1].shape, self.dtype)
        ins = [self, target] + ([weight] if weight is not None else [])
        run_table("nll_loss_forward", ins, [out, tw], name, reduction=int(reduction),
                  ignore_index=int(ignore_index), has_weight=weight is not None, two_d=two_d)
        return out, tw
    return kernel


def _nll_backward(two_d: bool):
    name = "aten.nll_loss2d_backward" if two_d else "aten.nll_loss_backward"

    def kernel(grad_output, self, target, weight, reduction, ignore_index, total_weight, *,
               grad_input=None):
        if not operands_ok(grad_output, self, weight, total_weight, floats_only=True) \
                or not operands_ok(target):
            return None
        res = output_tensor(grad_input, self.shape, self.dtype)
        ins = [grad_output, self, target] + ([weight] if weight is not None else []) + \
            [total_weight]
        run_table("nll_loss_backward", ins, [res], name, reduction=int(reduction),
                  ignore_index=int(ignore_index), has_weight=weight is not None, two_d=two_d)
        return res
    return kernel


def mse_loss(self, target, reduction=1, *, out=None):
    if not operands_ok(self, target, floats_only=True):
        return None
    shape = tuple(torch.broadcast_shapes(self.shape, target.shape))
    a, b = self.expand(shape), target.expand(shape)
    res = output_tensor(out, shape if reduction == 0 else (), self.dtype)
    run_table("mse_loss", [a, b], [res], "aten.mse_loss", reduction=int(reduction))
    return res


def mse_loss_backward(grad_output, self, target, reduction, *, grad_input=None):
    if not operands_ok(grad_output, self, target, floats_only=True):
        return None
    shape = tuple(self.shape)
    res = output_tensor(grad_input, shape, self.dtype)
    run_table("mse_loss_backward", [grad_output.expand(shape), self, target.expand(shape)],
              [res], "aten.mse_loss_backward", reduction=int(reduction))
    return res


def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq,
                             *, out=None):
    if not operands_ok(grad_output, floats_only=True) or not operands_ok(indices):
        return None
    res = output_tensor(out, (int(num_weights), grad_output.shape[-1]), grad_output.dtype)
    run_table("embedding_backward", [grad_output, indices], [res],
              "aten.embedding_dense_backward", num_weights=int(num_weights),
              padding_idx=int(padding_idx), scale_grad_by_freq=bool(scale_grad_by_freq))
    return res


def _update(op: str, mode: str):
    """addcmul / addcdiv / lerp: functional, in-place (`self` is the result) or out=."""
    name = f"aten.{op}_" if mode == "inplace" else f"aten.{op}"

    def kernel(self, t1, t2=None, *, value=1, out=None, **kw):
        if op == "lerp":
            end, weight = t1, t2 if t2 is not None else kw.get("weight")
            if isinstance(weight, torch.Tensor) and weight.device.type != "xdna" and weight.dim():
                return None
            tensors = [self, end] + ([weight] if isinstance(weight, torch.Tensor) else [])
            params = {} if isinstance(weight, torch.Tensor) else {"weight": float(weight)}
        else:
            tensors, params = [self, t1, t2], {"value": value}
        tensors = [as_device_operand(t, self.dtype) if isinstance(t, torch.Tensor) and t.dim() == 0
                   and t.device.type != "xdna" else t for t in tensors]
        if not operands_ok(*tensors, floats_only=op != "addcmul"):
            return None                   # integer addcmul is exact; addcdiv/lerp take floats
        shape = tuple(torch.broadcast_shapes(*[t.shape for t in tensors]))
        if mode == "inplace" and tuple(self.shape) != shape:
            raise RuntimeError(f"xdna {op}_: output with shape {list(self.shape)} doesn't match "
                               f"the broadcast shape {list(shape)}")
        views = [t if tuple(t.shape) == shape else t.expand(shape) for t in tensors]
        dtype = self.dtype
        for t in tensors[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        res = self if mode == "inplace" else output_tensor(out, shape, out.dtype if out is not None
                                                           else dtype)
        run_table(op, views, [res], name, **params)
        return res
    return kernel


# -- dropout, log-sigmoid, smooth-L1 and BCE ----------------------------------------------------
def native_dropout(input, p, train, *, out0=None, out1=None):
    """The keep-mask is drawn by the xdna generator on the host and written to a BO (host-side
    initialisation, as torch.rand on the device); the masking and scaling run on the NPU."""
    if not operands_ok(input, floats_only=True):
        return None
    from torch_xdna.device.core import RNG
    out = output_tensor(out0, input.shape, input.dtype)
    mask = output_tensor(out1, input.shape, torch.bool)
    if train is False or p == 0:
        keep, scale = torch.ones(input.shape, dtype=torch.bool), 1.0
    elif p >= 1:
        keep, scale = torch.zeros(input.shape, dtype=torch.bool), 0.0
    else:
        keep = torch.empty(input.shape).bernoulli_(1 - p, generator=RNG.gen).bool()
        scale = 1.0 / (1.0 - p)
    if mask.numel():
        storage.host_view(mask, for_write=True).copy_(keep)
    run_table("dropout_apply", [input, mask], [out], "aten.native_dropout", scale=float(scale))
    return out, mask


def native_dropout_backward(grad_output, mask, scale, *, out=None):
    if not operands_ok(grad_output, floats_only=True) or not operands_ok(mask):
        return None
    res = output_tensor(out, grad_output.shape, grad_output.dtype)
    run_table("dropout_backward", [grad_output, mask], [res], "aten.native_dropout_backward",
              scale=float(scale))
    return res


def log_sigmoid_forward(self, *, output=None, buffer=None):
    if not operands_ok(self, floats_only=True):
        return None
    out = output_tensor(output, self.shape, self.dtype)
    buf = output_tensor(buffer, self.shape, self.dtype)
    run_table("log_sigmoid_forward", [self], [out, buf], "aten.log_sigmoid_forward")
    return out, buf


def log_sigmoid_backward(grad_output, self, buffer, *, grad_input=None):
    if not operands_ok(grad_output, self, buffer, floats_only=True):
        return None
    res = output_tensor(grad_input, self.shape, self.dtype)
    run_table("log_sigmoid_backward", [grad_output.expand(self.shape), self, buffer], [res],
              "aten.log_sigmoid_backward")
    return res


def smooth_l1_loss(self, target, reduction=1, beta=1.0, *, out=None):
    if not operands_ok(self, target, floats_only=True):
        return None
    shape = tuple(torch.broadcast_shapes(self.shape, target.shape))
    res = output_tensor(out, shape if reduction == 0 else (), self.dtype)
    run_table("smooth_l1_loss", [self.expand(shape), target.expand(shape)], [res],
              "aten.smooth_l1_loss", reduction=int(reduction), beta=float(beta))
    return res


def smooth_l1_loss_backward(grad_output, self, target, reduction, beta, *, grad_input=None):
    if not operands_ok(grad_output, self, target, floats_only=True):
        return None
    res = output_tensor(grad_input, self.shape, self.dtype)
    run_table("smooth_l1_loss_backward", [grad_output, self, target.expand(self.shape)], [res],
              "aten.smooth_l1_loss_backward", reduction=int(reduction), beta=float(beta))
    return res


def binary_cross_entropy(self, target, weight=None, reduction=1, *, out=None):
    if not operands_ok(self, target, weight, floats_only=True):
        return None
    res = output_tensor(out, self.shape if reduction == 0 else (), self.dtype)
    ins = [self, target] + ([weight.expand(self.shape)] if weight is not None else [])
    run_table("binary_cross_entropy", ins, [res], "aten.binary_cross_entropy",
              reduction=int(reduction), has_weight=weight is not None)
    return res


def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=1, *,
                                  grad_input=None):
    if not operands_ok(grad_output, self, target, weight, floats_only=True):
        return None
    res = output_tensor(grad_input, self.shape, self.dtype)
    ins = [grad_output, self, target] + ([weight.expand(self.shape)] if weight is not None else [])
    run_table("binary_cross_entropy_backward", ins, [res], "aten.binary_cross_entropy_backward",
              reduction=int(reduction), has_weight=weight is not None)
    return res


def register_ops(reg: Callable) -> None:
    for op in ("threshold_backward", "gelu_backward", "sigmoid_backward", "tanh_backward",
               "silu_backward", "logit_backward"):
        k = _elementwise_backward(op, f"aten.{op}")
        reg(getattr(aten, op).default, k)
        reg(getattr(aten, op).grad_input, k)
    for op, tab in (("_softmax_backward_data", "softmax_backward"),
                    ("_log_softmax_backward_data", "log_softmax_backward")):
        k = _softmax_backward(tab, f"aten.{op}")
        reg(getattr(aten, op).default, k)
        reg(getattr(aten, op).out, k)
    reg(aten.native_layer_norm_backward.default, layer_norm_backward)
    reg(aten.nll_loss_forward.default, _nll_forward(False))
    reg(aten.nll_loss_forward.output, _nll_forward(False))
    reg(aten.nll_loss_backward.default, _nll_backward(False))
    reg(aten.nll_loss_backward.grad_input, _nll_backward(False))
    reg(aten.nll_loss2d_forward.default, _nll_forward(True))
    reg(aten.nll_loss2d_forward.output, _nll_forward(True))
    reg(aten.nll_loss2d_backward.default, _nll_backward(True))
    reg(aten.nll_loss2d_backward.grad_input, _nll_backward(True))
    reg(aten.mse_loss.default, mse_loss)
    reg(aten.mse_loss.out, mse_loss)
    reg(aten.mse_loss_backward.default, mse_loss_backward)
    reg(aten.mse_loss_backward.grad_input, mse_loss_backward)
    reg(aten.embedding_dense_backward.default, embedding_dense_backward)
    reg(aten.embedding_dense_backward.out, embedding_dense_backward)
    for op in ("addcmul", "addcdiv"):
        register_modes(reg, op, lambda mode, op=op: _update(op, mode))
    for ov in ("Scalar", "Tensor"):
        register_modes(reg, "lerp", lambda mode: _update("lerp", mode), ov)
    register_foreach(reg)
    reg(aten.native_dropout.default, native_dropout)
    reg(aten.native_dropout.out, native_dropout)
    reg(aten.native_dropout_backward.default, native_dropout_backward)
    reg(aten.native_dropout_backward.out, native_dropout_backward)
    reg(aten.log_sigmoid_forward.default, log_sigmoid_forward)
    reg(aten.log_sigmoid_forward.output, log_sigmoid_forward)
    reg(aten.log_sigmoid_backward.default, log_sigmoid_backward)
    reg(aten.log_sigmoid_backward.grad_input, log_sigmoid_backward)
    reg(aten.smooth_l1_loss.default, smooth_l1_loss)
    reg(aten.smooth_l1_loss.out, smooth_l1_loss)
    reg(aten.smooth_l1_loss_backward.default, smooth_l1_loss_backward)
    reg(aten.smooth_l1_loss_backward.grad_input, smooth_l1_loss_backward)
    reg(aten.binary_cross_entropy.default, binary_cross_entropy)
    reg(aten.binary_cross_entropy.out, binary_cross_entropy)
    reg(aten.binary_cross_entropy_backward.default, binary_cross_entropy_backward)
    reg(aten.binary_cross_entropy_backward.grad_input, binary_cross_entropy_backward)


# -- optimizer _foreach_* ops: one multi-tensor launch per op (kernels/ops/foreach.py) ----------------
_CEA = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _foreach(overload, base: str, arity: int, inplace: bool, scalars: str, param: str = ""):
    """scalars: '' (none), 'one' (a Scalar), 'list' (a Scalar[]); they are the last operand
    unless `param` names the base op's parameter they fill. Lists the design does not take
    (mixed dtypes or shapes, integer tensors) run PyTorch's per-tensor decomposition, whose ops
    land on the NPU kernels one by one."""
    name = f"aten.{overload._schema.name.split('::')[1]}"

    def kernel(*args, **kwargs):
        lists = [list(a) for a in args[:arity]]
        rest = list(args[arity:])
        first = lists[0]
        n = len(first)
        dtype = first[0].dtype if n else None
        good = n > 0 and dtype in FLOAT_COMPUTE and all(
             len(lst) == n and all(isinstance(t, torch.Tensor) and t.device.type == "xdna"
                                   and t.dtype == dtype and t.shape == first[i].shape
                                  for i, t in enumerate(lst)) for lst in lists)
        if scalars:
            v = rest[0] if rest else kwargs.get("scalar", kwargs.get("scalars",
                                                 kwargs.get("value", kwargs.get("weight"))))
            values = tuple(v) if scalars == "list" else (v,) * n
            good = good and len(values) == n and all(isinstance(x, (int, float))
                                                     for x in values)
        else:
            values = ()
        if not good:
            return overload.redispatch(_CEA, *args, **kwargs)
        outs = first if inplace else [storage.empty(t.shape, dtype) for t in first]
        total = sum(t.numel() for t in first)
        params = {"alpha": kwargs["alpha"]} if kwargs.get("alpha", 1) != 1 else {}
        design = design_for(ForeachDesign, base, ((total,),) * arity, (dtype,) * arity,
                            (total,), dtype, (), n, arity, bool(scalars) and not param, param)
        launch(design, [t for lst in lists for t in lst], outs, name,
               **({"values": tuple(float(x) for x in values)} if scalars else {}), **params)
        return None if inplace else outs
    return kernel


FOREACH = (  # (op, base, arity, scalars, param)
    ("add", "List", "add", 2, "", ""), ("add", "Scalar", "add", 1, "one", ""),
    ("add", "ScalarList", "add", 1, "list", ""), ("sub", "List", "sub", 2, "", ""),
    ("sub", "Scalar", "sub", 1, "one", ""), ("sub", "ScalarList", "sub", 1, "list", ""),
    ("mul", "List", "mul", 2, "", ""), ("mul", "Scalar", "mul", 1, "one", ""),
    ("mul", "ScalarList", "mul", 1, "list", ""), ("div", "List", "div", 2, "", ""),
    ("div", "Scalar", "div", 1, "one", ""), ("div", "ScalarList", "div", 1, "list", ""),
    ("addcmul", "Scalar", "addcmul", 3, "one", "value"),
    ("addcmul", "ScalarList", "addcmul", 3, "list", "value"),
    ("addcdiv", "Scalar", "addcdiv", 3, "one", "value"),
    ("addcdiv", "ScalarList", "addcdiv", 3, "list", "value"),
    ("lerp", "List", "lerp", 3, "", ""), ("lerp", "Scalar", "lerp", 2, "one", "weight"),
    ("sqrt", "default", "sqrt", 1, "", ""), ("neg", "default", "neg", 1, "", ""),
)


_foreach_libs: list[torch.library.Library] = []


def register_foreach(reg: Callable) -> None:
    """Functional variants go through the op table's `reg`; in-place ones return None, which
    the table's guard reads as "no kernel", so they are registered here directly."""
    from torch_xdna.device import COVERED_OPS
    lib = torch.library.Library("aten", "IMPL")
    _foreach_libs.append(lib)
    for op, ov, base, arity, scalars, param in FOREACH:
        for inplace in (True, False):
            packet = getattr(aten, f"_foreach_{op}" + ("_" if inplace else ""), None)
            if packet is None or ov not in packet.overloads():
                continue
            overload = getattr(packet, ov)
            fn = _foreach(overload, base, arity, inplace, scalars, param)
            if inplace:
                lib.impl(overload, fn, "PrivateUse1")
                COVERED_OPS.append(f"aten._foreach_{op}_.{ov}")
            else:
                reg(overload, fn)
