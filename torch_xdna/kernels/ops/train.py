"""Backward ops, losses and optimizer arithmetic on the vector unit (TableDesign ops).

Numerics follow the one policy (kernels/numerics.py): products take bf16 operands and accumulate
in fp32; selects, index accumulation (nll_loss, embedding backward) and the accumulator term of an
update (`self` in addcmul/addcdiv/lerp: parameters and optimizer state) stay fp32, so an optimizer
step never rounds the weights to bf16. References run PyTorch's CPU formulas in fp32 on operands
rounded as the array sees them.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels import numerics
from torch_xdna.kernels.ops.table import define

aten = torch.ops.aten
bf16 = numerics.operand


# -- activation backward (elementwise: grad, saved tensor) -------------------------------------
define("threshold_backward", lambda xs, threshold, **kw: torch.where(
    xs[1] <= threshold, torch.zeros((), dtype=xs[0].dtype), xs[0]), 1, numerics="exact")
define("gelu_backward", lambda xs, approximate="none", **kw: aten.gelu_backward(
    xs[0], xs[1], approximate=approximate), 9)
define("sigmoid_backward", lambda xs, **kw: aten.sigmoid_backward(xs[0], xs[1]), 2)
define("tanh_backward", lambda xs, **kw: aten.tanh_backward(xs[0], xs[1]), 2)
define("logit_backward", lambda xs, eps=None, **kw: aten.logit_backward(xs[0], xs[1], eps), 4)
define("silu_backward", lambda xs, **kw: aten.silu_backward(xs[0], xs[1]), 8)


# -- softmax family backward (rows along the last dim) ------------------------------------------
define("softmax_backward", lambda xs, **kw: aten._softmax_backward_data(
    xs[0], xs[1], -1, torch.float32), 4, row=True)
define("log_softmax_backward", lambda xs, **kw: aten._log_softmax_backward_data(
    xs[0], xs[1], -1, torch.float32), 5, row=True)


def _layer_norm_backward(xs, row_dims, has_weight, has_bias, **kw):
    """grad_input, grad_weight, grad_bias; x - mean and the statistics stay fp32, the gradient
    and the weight enter as bf16."""
    g, x, mean, rstd = bf16(xs[0]), xs[1], xs[2], xs[3]
    w = bf16(xs[4]) if has_weight else None
    b = xs[5 if has_weight else 4] if has_bias else None
    shape = list(x.shape[x.dim() - row_dims:])
    gi, gw, gb = aten.native_layer_norm_backward(g, x, shape, mean, rstd, w, b,
                                                 [True, has_weight, has_bias])
    return gi, gw, gb


define("layer_norm_backward", _layer_norm_backward, 10, row=True, numerics="exact")


# -- losses ------------------------------------------------------------------------------------
def _nll_forward(xs, reduction, ignore_index, has_weight, two_d=False, **kw):
    xs = [x.contiguous() for x in xs]             # the CPU formula wants dense rows
    w = xs[2] if has_weight else None
    fn = aten.nll_loss2d_forward if two_d else aten.nll_loss_forward
    return fn(xs[0], xs[1], w, reduction, ignore_index)


def _nll_backward(xs, reduction, ignore_index, has_weight, two_d=False, **kw):
    xs = [x.contiguous() for x in xs]
    w = xs[3] if has_weight else None
    fn = aten.nll_loss2d_backward if two_d else aten.nll_loss_backward
    tw = xs[-1]
    return fn(xs[0], xs[1], xs[2], w, reduction, ignore_index, tw)


# a select of one log-probability per row, summed on the accumulator: exact
define("nll_loss_forward", _nll_forward, 1, numerics="exact")
define("nll_loss_backward", _nll_backward, 1, numerics="exact")


def _mse(xs, reduction, **kw):
    d = bf16(xs[0] - xs[1])                       # the difference is exact; squared as bf16
    sq = d * d
    return sq.mean() if reduction == 1 else sq.sum() if reduction == 2 else sq


def _mse_backward(xs, reduction, **kw):
    g, x, t = xs
    n = x.numel() if reduction == 1 else 1
    return bf16(g) * bf16(x - t) * (2.0 / max(1, n))


define("mse_loss", _mse, 2, numerics="exact")
define("mse_loss_backward", _mse_backward, 3, numerics="exact")
define("embedding_backward", lambda xs, num_weights, padding_idx, scale_grad_by_freq, **kw:
       aten.embedding_dense_backward(xs[0], xs[1], num_weights, padding_idx,
                                     scale_grad_by_freq), 1, numerics="exact")


# -- optimizer arithmetic: self + value * f(t1, t2); self stays fp32 ----------------------------
define("addcmul", lambda xs, value=1.0, **kw: xs[0] + value * (bf16(xs[1]) * bf16(xs[2])), 2,
       numerics="exact")
define("addcdiv", lambda xs, value=1.0, **kw: xs[0] + value * (bf16(xs[1]) / bf16(xs[2])), 5,
       numerics="exact")
define("lerp", lambda xs, weight=None, **kw: xs[0] + (
    bf16(xs[2]) if weight is None else weight) * bf16(xs[1] - xs[0]), 2, numerics="exact")


# -- dropout (the keep-mask comes from the host RNG, as every torch.rand on the device), more
# losses and activations training loops meet ---------------------------------------------------
define("dropout_apply", lambda xs, scale, **kw: xs[0] * xs[1].float() * scale, 2)
define("dropout_backward", lambda xs, scale, **kw: xs[0] * xs[1].float() * scale, 2)
define("log_sigmoid_forward", lambda xs, **kw: aten.log_sigmoid_forward(xs[0]), 7)
define("log_sigmoid_backward", lambda xs, **kw: aten.log_sigmoid_backward(xs[0], xs[1], xs[2]),
       7)
define("smooth_l1_loss", lambda xs, reduction, beta, **kw: aten.smooth_l1_loss(
    xs[0], xs[1], reduction, beta), 4)
define("smooth_l1_loss_backward", lambda xs, reduction, beta, **kw: aten.smooth_l1_loss_backward(
    xs[0], xs[1], xs[2], reduction, beta), 4)
define("binary_cross_entropy", lambda xs, reduction, has_weight, **kw: aten.binary_cross_entropy(
    xs[0], xs[1], xs[2] if has_weight else None, reduction), 8)
define("binary_cross_entropy_backward", lambda xs, reduction, has_weight, **kw:
       aten.binary_cross_entropy_backward(xs[0], xs[1], xs[2], xs[3] if has_weight else None,
                                          reduction), 6)
