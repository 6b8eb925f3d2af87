"""Capture: Dynamo graph -> core-ATen forward graph via aot_autograd.

Core-ATen decompositions, except ops we lower whole (KEEP_WHOLE: attention, SiLU, the conv
family's pixel shuffle and upsampling): decomposing SDPA would leave a dozen small nodes where one
attention design fits. SDPA and F.interpolate become custom ops (xdna_compiler::sdpa, ::upsample2d)
that stay one node through aot_autograd. Inductor is not used: xdna tensors have no host data
pointers to generate C++ against.
"""
from __future__ import annotations

import functools
import logging
import warnings

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from torch_xdna.compiler.views import replace_node

log = logging.getLogger("torch_xdna.compiler")
aten = torch.ops.aten
KEEP_WHOLE = (aten._scaled_dot_product_flash_attention_for_cpu.default, aten.silu.default,
              aten.gelu.default, aten.native_layer_norm.default, aten._softmax.default,
              # conv family (compiler/lower_conv.py): one design each, not index arithmetic;
              # native_batch_norm_backward: backward graphs run op by op on the eager device,
              # where it is one WindowDesign launch (decomposed, ~20 elementwise launches)
              aten.pixel_shuffle.default, aten.pixel_unshuffle.default,
              aten.native_batch_norm_backward.default,
              aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
              aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec)


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    table = dict(core_aten_decompositions())
    for op in KEEP_WHOLE:
        table.pop(op, None)
    return table


class TrainingGraphWarning(UserWarning):
    pass


@torch.library.custom_op("xdna_compiler::sdpa", mutates_args=())
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
         is_causal: bool, scale: float | None, enable_gqa: bool) -> torch.Tensor:
    """Scaled dot-product attention as ONE graph node on every device (on 'xdna' tensors the
    core decomposition would otherwise expand it into a dozen math nodes)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return _heads_inner(out.contiguous()) if out.dim() == 4 else out.contiguous()


def _heads_inner(out: torch.Tensor) -> torch.Tensor:
    """[B,H,S,D] values stored as [B,S,H,D]: the layout the output projection reads, so the
    usual transpose(1, 2).reshape(B, S, H*D) after attention is a view, not a copy."""
    return out.transpose(1, 2).contiguous().transpose(1, 2)


@sdpa.register_fake
def _(q, k, v, attn_mask, is_causal, scale, enable_gqa):
    out = q.new_empty(tuple(q.shape[:-1]) + (v.shape[-1],))
    return _heads_inner(out) if out.dim() == 4 else out


SDPA_TARGETS = {torch._C._nn.scaled_dot_product_attention,
                torch.nn.functional.scaled_dot_product_attention}


def replace_sdpa(gm: torch.fx.GraphModule) -> int:
    """Inference graphs: SDPA calls -> xdna_compiler::sdpa (kept whole through aot_autograd)."""
    n_done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target not in SDPA_TARGETS:
            continue
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
        kw = dict(zip(names, n.args))
        kw.update(n.kwargs)
        if kw.get("dropout_p", 0.0) not in (0, 0.0):
            continue
        replace_node(gm, n, torch.ops.xdna_compiler.sdpa.default, (
            kw["query"], kw["key"], kw["value"], kw.get("attn_mask"),
            bool(kw.get("is_causal", False)), kw.get("scale"), bool(kw.get("enable_gqa", False))))
        n_done += 1
    if n_done:
        gm.recompile()
    return n_done


@torch.library.custom_op("xdna_compiler::upsample2d", mutates_args=())
def upsample2d(x: torch.Tensor, size: list[int], mode: str, align_corners: bool,
               scale_h: float | None, scale_w: float | None) -> torch.Tensor:
    """F.interpolate (nearest / bilinear, 4-D) as ONE graph node on every device: the aten
    upsample ops carry Python decompositions at the Autograd key, which aot_autograd would
    expand into index arithmetic."""
    if mode == "nearest":
        return aten.upsample_nearest2d.default(x, size, scale_h, scale_w)
    return aten.upsample_bilinear2d.default(x, size, align_corners, scale_h, scale_w)


@upsample2d.register_fake
def _(x, size, mode, align_corners, scale_h, scale_w):
    return x.new_empty(tuple(x.shape[:-2]) + tuple(size))


UPSAMPLE = upsample2d._opoverload


def replace_interpolate(gm: torch.fx.GraphModule) -> int:
    """Dynamo graphs: F.interpolate (nearest / bilinear, 4-D, static output size) ->
    xdna_compiler::upsample2d, so the op reaches the partitioner whole."""
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not torch.nn.functional.interpolate:
            continue
        names = ("input", "size", "scale_factor", "mode", "align_corners",
                 "recompute_scale_factor", "antialias")
        kw = dict(zip(names, n.args))
        kw.update(n.kwargs)
        mode = kw.get("mode", "nearest")
        out = n.meta.get("example_value")
        if mode not in ("nearest", "bilinear") or kw.get("antialias") or out is None \
                or out.dim() != 4 or not all(isinstance(s, int) for s in out.shape):
            continue
        sf = kw.get("scale_factor")
        if sf is not None and not kw.get("recompute_scale_factor"):
            sf = list(sf) if isinstance(sf, (list, tuple)) else [sf, sf]
            scales = (float(sf[0]), float(sf[1]))
        else:
            scales = (None, None)
        osz = [int(s) for s in out.shape[-2:]]
        replace_node(gm, n, UPSAMPLE, (kw["input"], osz, mode,
                                        bool(kw.get("align_corners") or False), *scales))
        done += 1
    if done:
        gm.recompile()
    return done


def host_backward_compiler(gm: torch.fx.GraphModule, example_inputs):
    """Backward graphs run op by op (host, or the eager xdna device): used only when a caller
    passes no backward compiler."""
    n = sum(1 for x in gm.graph.nodes if x.op == "call_function")
    msg = (f"xdna compile: backward graph ({n} nodes) is not compiled for the NPU; it runs op by "
           f"op (on the host for CPU tensors, through the eager 'xdna' device for xdna tensors).")
    log.info(msg)
    warnings.warn(msg, TrainingGraphWarning, stacklevel=2)
    return make_boxed_func(gm.forward)


def capture(gm, example_inputs, forward_compiler, backward_compiler=None,
            inference_compiler=None):
    """aot_autograd with our decompositions; `forward_compiler(gm, inputs)` lowers training
    forward graphs (and inference graphs unless `inference_compiler` is given),
    `backward_compiler` the backward graphs (the same pipeline: partition, fuse, one Program
    per partition)."""
    if not torch.is_grad_enabled():
        replace_sdpa(gm)
        replace_interpolate(gm)
    return aot_autograd(fw_compiler=forward_compiler,
                        bw_compiler=backward_compiler or host_backward_compiler,
                        inference_compiler=inference_compiler or forward_compiler,
                        decompositions=decompositions())(gm, example_inputs)
