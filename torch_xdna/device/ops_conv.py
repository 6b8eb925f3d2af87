"""Eager kernels of the conv family on xdna tensors: convolution (and its backward), batch-norm,
pooling, interpolation and pixel_shuffle, each one launch of a design from kernels/ops/conv.py or
kernels/ops/pool.py (see their docstrings for the mapping). Output shapes come from PyTorch's own
meta kernels, so every shape rule (ceil_mode, output_padding, adaptive bins) is PyTorch's.

On PrivateUse1, F.conv2d reaches aten.convolution_overrideable through aten.convolution; both
(and aten._convolution) are registered here, and the Autograd key keeps convolution's own
derivative (convolution_backward, registered here too).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from torch_xdna.device import storage
from torch_xdna.device.kernel import FLOAT_COMPUTE, design_for, is_xdna, launch
from torch_xdna.kernels import VectorDesign
from torch_xdna.kernels.ops.conv import ConvDesign, transposed_size
from torch_xdna.kernels.ops.pool import GENERIC, MoveDesign, WindowDesign

aten = torch.ops.aten


def _float_ok(*ts) -> bool:
    return all(t is None or (is_xdna(t) and t.dtype in FLOAT_COMPUTE) for t in ts)


def _meta(t):
    if isinstance(t, torch.Tensor):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if isinstance(t, (list, tuple)):
        return type(t)(_meta(x) for x in t)
    return t


def _meta_outs(op, args) -> tuple:
    r = op(*[_meta(a) for a in args])
    return tuple(r) if isinstance(r, (tuple, list)) else (r,)


def _fresh_or(out: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    if out is None:
        return storage.empty(like.shape, like.dtype)
    if tuple(out.shape) != tuple(like.shape):
        out.resize_(like.shape)
    return out


# --- convolution ------------------------------------------------------------------------------
def _tuple(v, nd: int) -> tuple:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(int(x) for x in (v * nd if len(v) == 1 else v))


def _conv_geometry(x, w, stride, padding, dilation, output_padding) -> tuple | None:
    nd = x.dim() - 2
    if nd not in (1, 2) or w.dim() != x.dim():
        return None
    return (_tuple(stride, nd), _tuple(padding, nd), _tuple(dilation, nd),
            _tuple(output_padding or [0], nd))


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                *rest):
    if not _float_ok(input, weight, bias) or input.dim() < 3:
        return None
    geo = _conv_geometry(input, weight, stride, padding, dilation, output_padding)
    if geo is None or weight.dtype != input.dtype:
        return None
    s, p, d, op = geo
    design = design_for(ConvDesign, tuple(input.shape), tuple(weight.shape), s, p, d, int(groups),
                        bool(transposed), op if transposed else (), bias=bias is not None,
                        out_dtype=input.dtype)
    out = storage.empty(design.out_shape, input.dtype)
    if out.numel():
        ins = [input, weight] + ([bias] if bias is not None else [])
        launch(design, ins, [out], "aten.convolution")
    return out


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    """grad input: the transposed conv of grad_output (for a transposed conv: the plain conv);
    grad weight: the band-streamed GEMM over im2col; grad bias: a sum over (N, spatial)."""
    if not _float_ok(grad_output, input, weight):
        return None
    geo = _conv_geometry(input, weight, stride, padding, dilation, output_padding)
    if geo is None:
        return None
    s, p, d, op = geo
    nd = input.dim() - 2
    g = int(groups)
    gi = gw = gb = None
    if grad_output.numel() == 0 or input.numel() == 0:
        # nothing to reduce over: the gradients are zero (no launch), as on the CPU
        gi = storage.empty(input.shape, input.dtype) if output_mask[0] else None
        gw = storage.empty(weight.shape, weight.dtype) if output_mask[1] else None
        gb = storage.empty((grad_output.shape[1],), grad_output.dtype) if output_mask[2] else None
        for t in (gi, gw, gb):
            if t is not None and t.numel():
                t.zero_()
        return gi, gw, gb
    if output_mask[0]:
        if transposed:
            dg = design_for(ConvDesign, tuple(grad_output.shape), tuple(weight.shape), s, p, d, g,
                            False, (), out_dtype=input.dtype)
        else:
            fit = tuple(int(i) - transposed_size(int(o), int(k), a, b, c, 0) for i, o, k, a, b, c in
                        zip(input.shape[2:], grad_output.shape[2:], weight.shape[2:], s, p, d))
            dg = design_for(ConvDesign, tuple(grad_output.shape), tuple(weight.shape), s, p, d, g,
                            True, fit, out_dtype=input.dtype)
        if dg.out_shape != tuple(input.shape):
            return None
        gi = storage.empty(input.shape, input.dtype)
        if gi.numel():
            launch(dg, [grad_output, weight], [gi], "aten.convolution_backward")
    if output_mask[1]:
        if transposed:
            wg = design_for(ConvDesign, tuple(grad_output.shape), tuple(weight.shape), s, p, d, g,
                            mode="weight_grad", out_dtype=weight.dtype)
            ins = [input, grad_output]
            ok = wg.conv_out_shape[2:] == tuple(input.shape[2:])
        else:
            wg = design_for(ConvDesign, tuple(input.shape), tuple(weight.shape), s, p, d, g,
                            mode="weight_grad", out_dtype=weight.dtype)
            ins = [grad_output, input]
            ok = wg.conv_out_shape[2:] == tuple(grad_output.shape[2:])
        if not ok:
            return None
        gw = storage.empty(weight.shape, weight.dtype)
        launch(wg, ins, [gw], "aten.convolution_backward")
    if output_mask[2]:
        c = grad_output.shape[1]
        dims = (0,) + tuple(range(2, 2 + nd))
        gb = storage.empty((c,), grad_output.dtype)
        vd = design_for(VectorDesign, "sum", (tuple(grad_output.shape),), (grad_output.dtype,),
                        (c,), gb.dtype, (("dims", dims), ("keepdim", False)))
        launch(vd, [grad_output], [gb], "aten.convolution_backward")
    return gi, gw, gb


def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
                                      transposed, output_padding, groups, output_mask):
    return convolution_backward(grad_output, input, weight, None, stride, padding, dilation,
                                transposed, output_padding, groups, output_mask)


# --- window ops (pooling, interpolation, batch-norm) ------------------------------------------
def _window(wop: str, meta_op, args: Sequence, inputs: Sequence[torch.Tensor], params: dict,
            aten_name: str, outs: Sequence[torch.Tensor | None] = (), extra_outs=(),
            metas: tuple | None = None) -> tuple:
    metas = metas if metas is not None else _meta_outs(meta_op, args)
    res = [_fresh_or(outs[i] if i < len(outs) else None, m) for i, m in enumerate(metas)]
    all_outs = list(res) + list(extra_outs)
    if any(t.numel() for t in res):
        design = design_for(WindowDesign, wop, tuple(tuple(t.shape) for t in inputs),
                            tuple(t.dtype for t in inputs), tuple(tuple(t.shape) for t in all_outs),
                            tuple(t.dtype for t in all_outs), tuple(sorted(params.items())))
        launch(design, list(inputs), all_outs, aten_name)
    return tuple(res)


def _pair(v, default=None) -> tuple:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return tuple(default) if default is not None else ()
    return _tuple(v, 2)


def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False,
                            *, out=None, indices=None):
    if not _float_ok(self):
        return None
    k = _pair(kernel_size)
    prm = dict(kernel=k, stride=_pair(stride, k), padding=_pair(padding), dilation=_pair(dilation),
               ceil_mode=bool(ceil_mode))
    args = (self, list(k), list(prm["stride"]), list(prm["padding"]), list(prm["dilation"]),
            bool(ceil_mode))
    return _window("max_pool", aten.max_pool2d_with_indices.default, args, [self], prm,
                   "aten.max_pool2d_with_indices", (out, indices))


def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices, *, grad_input=None):
    if not _float_ok(grad_output, self) or not is_xdna(indices):
        return None
    k = _pair(kernel_size)
    prm = dict(kernel=k, stride=_pair(stride, k), padding=_pair(padding), dilation=_pair(dilation),
               ceil_mode=bool(ceil_mode))
    args = (grad_output, self, list(k), list(prm["stride"]), list(prm["padding"]),
            list(prm["dilation"]), bool(ceil_mode), indices)
    return _window("max_pool_backward", aten.max_pool2d_with_indices_backward.default, args,
                   [grad_output, self, indices], prm, "aten.max_pool2d_with_indices_backward",
                   (grad_input,))[0]


def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None, *, out=None):
    if not _float_ok(self):
        return None
    k = _pair(kernel_size)
    prm = dict(kernel=k, stride=_pair(stride, k), padding=_pair(padding), ceil_mode=bool(ceil_mode),
               count_include_pad=bool(count_include_pad), divisor_override=divisor_override)
    args = (self, list(k), list(prm["stride"]), list(prm["padding"]), bool(ceil_mode),
            bool(count_include_pad), divisor_override)
    return _window("avg_pool", aten.avg_pool2d.default, args, [self], prm, "aten.avg_pool2d",
                   (out,))[0]


def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override, *, grad_input=None):
    if not _float_ok(grad_output, self):
        return None
    k = _pair(kernel_size)
    prm = dict(kernel=k, stride=_pair(stride, k), padding=_pair(padding), ceil_mode=bool(ceil_mode),
               count_include_pad=bool(count_include_pad), divisor_override=divisor_override)
    args = (grad_output, self, list(k), list(prm["stride"]), list(prm["padding"]), bool(ceil_mode),
            bool(count_include_pad), divisor_override)
    return _window("avg_pool_backward", aten.avg_pool2d_backward.default, args,
                   [grad_output, self], prm, "aten.avg_pool2d_backward", (grad_input,))[0]


def adaptive_avg_pool2d(self, output_size):
    if not _float_ok(self):
        return None
    prm = dict(output_size=_pair(output_size))
    return _window("adaptive_avg_pool", aten._adaptive_avg_pool2d.default,
                   (self, list(prm["output_size"])), [self], prm, "aten._adaptive_avg_pool2d")[0]


def adaptive_avg_pool2d_backward(grad_output, self):
    if not _float_ok(grad_output, self):
        return None
    prm = dict(output_size=tuple(grad_output.shape[-2:]))
    return _window("adaptive_avg_pool_backward", aten._adaptive_avg_pool2d_backward.default,
                   (grad_output, self), [grad_output, self], prm,
                   "aten._adaptive_avg_pool2d_backward")[0]


def adaptive_max_pool2d(self, output_size, *, out=None, indices=None):
    if not _float_ok(self):
        return None
    prm = dict(output_size=_pair(output_size))
    return _window("adaptive_max_pool", aten.adaptive_max_pool2d.default,
                   (self, list(prm["output_size"])), [self], prm, "aten.adaptive_max_pool2d",
                   (out, indices))


def adaptive_max_pool2d_backward(grad_output, self, indices, *, grad_input=None):
    if not _float_ok(grad_output, self) or not is_xdna(indices):
        return None
    prm = dict(output_size=tuple(grad_output.shape[-2:]))
    return _window("adaptive_max_pool_backward", aten.adaptive_max_pool2d_backward.default,
                   (grad_output, self, indices), [grad_output, self, indices], prm,
                   "aten.adaptive_max_pool2d_backward", (grad_input,))[0]


def _scales(scales_h, scales_w) -> tuple:
    return (None if scales_h is None else float(scales_h), None if scales_w is None else float(scales_w))


def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None, *, out=None):
    if not is_xdna(self) or self.dtype not in FLOAT_COMPUTE + (torch.uint8,):
        return None
    osz = _pair(output_size)
    h, w = self.shape[-2:]
    sc = _scales(scales_h, scales_w)
    integer = osz[0] % h == 0 and osz[1] % w == 0 and all(
        s is None or s == o // i for s, o, i in zip(sc, osz, (h, w)))
    if integer:               # pure replication: the DMA engines alone, bit exact
        shape = tuple(self.shape[:-2]) + osz
        res = _fresh_or(out, torch.empty(shape, dtype=self.dtype, device="meta"))
        if res.numel():
            launch(design_for(MoveDesign, "upsample_nearest", tuple(self.shape), self.dtype, shape,
                              (osz[0] // h, osz[1] // w)), [self], [res], "aten.upsample_nearest2d")
        return res
    prm = dict(output_size=osz, scales=sc)
    return _window("upsample_nearest", aten.upsample_nearest2d.default, (self, list(osz), *sc),
                   [self], prm, "aten.upsample_nearest2d", (out,))[0]


def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None, scales_w=None,
                                *, grad_input=None):
    if not _float_ok(grad_output):
        return None
    prm = dict(output_size=_pair(output_size), input_size=tuple(int(x) for x in input_size),
               scales=_scales(scales_h, scales_w))
    return _window("upsample_nearest_backward", aten.upsample_nearest2d_backward.default,
                   (grad_output, list(prm["output_size"]), list(prm["input_size"]), *prm["scales"]),
                   [grad_output], prm, "aten.upsample_nearest2d_backward", (grad_input,))[0]


def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None, *, out=None):
    if not _float_ok(self):
        return None
    prm = dict(output_size=_pair(output_size), align_corners=bool(align_corners),
               scales=_scales(scales_h, scales_w))
    return _window("upsample_bilinear", aten.upsample_bilinear2d.default,
                   (self, list(prm["output_size"]), bool(align_corners), *prm["scales"]), [self], prm,
                   "aten.upsample_bilinear2d", (out,))[0]


def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners, scales_h=None,
                                 scales_w=None, *, grad_input=None):
    if not _float_ok(grad_output):
        return None
    prm = dict(output_size=_pair(output_size), input_size=tuple(int(x) for x in input_size),
               align_corners=bool(align_corners), scales=_scales(scales_h, scales_w))
    return _window("upsample_bilinear_backward", aten.upsample_bilinear2d_backward.default,
                   (grad_output, list(prm["output_size"]), list(prm["input_size"]),
                    bool(align_corners), *prm["scales"]), [grad_output], prm,
                   "aten.upsample_bilinear2d_backward", (grad_input,))[0]


def _frozen(v):
    if isinstance(v, (list, tuple)):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, torch.SymInt):
        return int(v)
    return v


def _generic_window(name: str) -> Callable:
    """Interpolation modes and 3-D pooling by name (kernels/ops/pool.py GENERIC)."""
    op = getattr(aten, name).default

    def kernel(self, *args, out=None, indices=None):
        if not _float_ok(self):
            return None
        args = _frozen(args)
        prm = dict(aten=name, args=args)
        res = _window("aten", op, (self, *args), [self], prm, f"aten.{name}", (out, indices))
        return res if len(res) > 1 else res[0]
    return kernel


# --- batch norm -------------------------------------------------------------------------------
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                      *, aten_name="aten.native_batch_norm"):
    if not _float_ok(input) or not all(t is None or is_xdna(t) for t in
                                       (weight, bias, running_mean, running_var)):
        return None
    has_running = running_mean is not None and running_var is not None
    if not training and not has_running:
        return None
    ins = [input] + [t for t in (weight, bias) if t is not None]
    ins += [running_mean, running_var] if has_running else []
    prm = dict(training=bool(training), momentum=float(momentum), eps=float(eps),
               has_weight=weight is not None, has_bias=bias is not None, has_running=has_running)
    extra = [running_mean, running_var] if has_running and training else []
    c = input.shape[1] if training else 0           # eval: empty saved statistics, as on the CPU
    stat = torch.float32 if input.dtype != torch.float64 else input.dtype
    metas = (torch.empty(input.shape, dtype=input.dtype, device="meta"),
             torch.empty((c,), dtype=stat, device="meta"), torch.empty((c,), dtype=stat, device="meta"))
    return _window("batch_norm", None, (), ins, prm, aten_name, extra_outs=extra, metas=metas)


def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    ts = (weight, running_mean, running_var, save_mean, save_invstd)
    if not _float_ok(grad_out, input) or not all(t is None or is_xdna(t) for t in ts):
        return None
    has_running = running_mean is not None and running_var is not None
    if save_mean is None or save_invstd is None:
        if train or not has_running:
            return None
    mask = tuple(bool(m) for m in output_mask)
    sm = save_mean if save_mean is not None else running_mean
    si = save_invstd if save_invstd is not None else running_var
    ins = [grad_out, input] + ([weight] if weight is not None else [])
    ins += [running_mean, running_var] if has_running else []
    ins += [sm, si]
    prm = dict(training=bool(train), eps=float(eps), has_weight=weight is not None,
               has_running=has_running, mask=mask)
    metas = _meta_outs(aten.native_batch_norm_backward.default,
                       (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                        bool(train), eps, list(mask)))
    res = [storage.empty(m.shape, m.dtype) if on else None for m, on in zip(metas, mask)]
    outs = [r for r in res if r is not None]
    if outs and input.numel():
        design = design_for(WindowDesign, "batch_norm_backward", tuple(tuple(t.shape) for t in ins),
                            tuple(t.dtype for t in ins), tuple(tuple(t.shape) for t in outs),
                            tuple(t.dtype for t in outs), tuple(sorted(prm.items())))
        launch(design, ins, outs, "aten.native_batch_norm_backward")
    return tuple(res)


def bn_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum,
                             eps, aten_name="aten._native_batch_norm_legit")


def bn_legit_no_stats(input, weight, bias, training, momentum, eps):
    return native_batch_norm(input, weight, bias, None, None, training, momentum, eps,
                             aten_name="aten._native_batch_norm_legit")


def bn_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return native_batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps,
                             aten_name="aten._native_batch_norm_legit_no_training")


# --- pixel shuffle (DMA) ----------------------------------------------------------------------
def _shuffle(op: str, meta_op) -> Callable:
    def kernel(self, factor):
        if not is_xdna(self) or self.dim() < 3:
            return None
        m = meta_op(_meta(self), factor)
        res = storage.empty(m.shape, self.dtype)
        if res.numel():
            launch(design_for(MoveDesign, op, tuple(self.shape), self.dtype, tuple(m.shape),
                              (int(factor), int(factor))), [self], [res], f"aten.{op}")
        return res
    return kernel


def register_ops(reg: Callable) -> None:
    """Called by device/ops.register with its `reg(overload, kernel)`."""
    for op in (aten.convolution.default, aten.convolution_overrideable.default):
        reg(op, convolution)
    reg(aten._convolution.default, convolution)
    reg(aten.convolution_backward.default, convolution_backward)
    reg(aten.convolution_backward_overrideable.default, convolution_backward_overrideable)
    reg(aten.native_batch_norm.default, native_batch_norm)
    reg(aten._native_batch_norm_legit.default, bn_legit)
    reg(aten._native_batch_norm_legit.no_stats, bn_legit_no_stats)
    reg(aten._native_batch_norm_legit_no_training.default, bn_no_training)
    reg(aten.native_batch_norm_backward.default, native_batch_norm_backward)
    pairs = [("max_pool2d_with_indices", max_pool2d_with_indices, ("out",)),
             ("max_pool2d_with_indices_backward", max_pool2d_with_indices_backward, ("grad_input",)),
             ("avg_pool2d", avg_pool2d, ("out",)),
             ("avg_pool2d_backward", avg_pool2d_backward, ("grad_input",)),
             ("_adaptive_avg_pool2d", adaptive_avg_pool2d, ()),
             ("_adaptive_avg_pool2d_backward", adaptive_avg_pool2d_backward, ()),
             ("adaptive_max_pool2d", adaptive_max_pool2d, ("out",)),
             ("adaptive_max_pool2d_backward", adaptive_max_pool2d_backward, ("grad_input",)),
             ("upsample_nearest2d", upsample_nearest2d, ("out",)),
             ("upsample_nearest2d_backward", upsample_nearest2d_backward, ("grad_input",)),
             ("upsample_bilinear2d", upsample_bilinear2d, ("out",)),
             ("upsample_bilinear2d_backward", upsample_bilinear2d_backward, ("grad_input",))]
    for name, fn, outs in pairs:
        packet = getattr(aten, name)
        reg(packet.default, fn)
        for ov in outs:
            if ov in packet.overloads():
                reg(getattr(packet, ov), fn)
    for name in GENERIC:
        packet = getattr(aten, name)
        reg(packet.default, _generic_window(name))
        reg(packet.out, _generic_window(name))
    reg(aten.pixel_shuffle.default, _shuffle("pixel_shuffle", aten.pixel_shuffle.default))
    reg(aten.pixel_unshuffle.default, _shuffle("pixel_unshuffle", aten.pixel_unshuffle.default))
