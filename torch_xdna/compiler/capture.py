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
    for op in KEEP_WHOLE:
        table.pop(op, None)
    return table


class TrainingGraphWarning(UserWarning):
    pass


def backward_compiler(gm: torch.fx.GraphModule, example_inputs):
    """Backward graphs are not fused: they run op by op (host, or the eager xdna device)."""
    n = sum(1 for x in gm.graph.nodes if x.op == "call_function")
    msg = (f"xdna compile: backward graph ({n} nodes) is not compiled for the NPU; it runs op by "
           f"op (on the host for CPU tensors, through the eager 'xdna' device for xdna tensors). "
           f"Use torch.no_grad()/inference_mode for NPU-fused inference.")
    log.info(msg)
    warnings.warn(msg, TrainingGraphWarning, stacklevel=2)
    return make_boxed_func(gm.forward)


def capture(gm, example_inputs, forward_compiler):
    """aot_autograd with our decompositions; `forward_compiler(gm, inputs)` lowers forward or
    inference graphs."""
    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                        inference_compiler=forward_compiler,
                        decompositions=decompositions())(gm, example_inputs)
