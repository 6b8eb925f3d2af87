"""Capture: Dynamo graph -> core-ATen forward graph via aot_autograd.

Core-ATen decompositions, except ops we lower whole (attention, SiLU): decomposing SDPA would
leave a dozen small nodes where one attention design fits. Inductor is not used: xdna tensors
have no host data pointers to generate C++ against.
"""
from __future__ import annotations

import functools
import logging
import warnings

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

log = logging.getLogger("torch_xdna.compiler")
aten = torch.ops.aten
KEEP_WHOLE = (aten._scaled_dot_product_flash_attention_for_cpu.default, aten.silu.default,
              aten.gelu.default, aten.native_layer_norm.default, aten._softmax.default)


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    table = dict(core_aten_decompositions())
    from torch_xdna.compiler.lower_conv import KEEP_WHOLE as CONV_WHOLE
    for op in KEEP_WHOLE + CONV_WHOLE:
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
        with gm.graph.inserting_before(n):
            new = gm.graph.call_function(torch.ops.xdna_compiler.sdpa.default, (
                kw["query"], kw["key"], kw["value"], kw.get("attn_mask"),
                bool(kw.get("is_causal", False)), kw.get("scale"), bool(kw.get("enable_gqa", False))))
        new.meta.update(n.meta)
        n.replace_all_uses_with(new)
        gm.graph.erase_node(n)
        n_done += 1
    if n_done:
        gm.recompile()
    return n_done


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
        from torch_xdna.compiler.lower_conv import replace_interpolate
        replace_interpolate(gm)
    return aot_autograd(fw_compiler=forward_compiler,
                        bw_compiler=backward_compiler or host_backward_compiler,
                        inference_compiler=inference_compiler or forward_compiler,
                        decompositions=decompositions())(gm, example_inputs)
