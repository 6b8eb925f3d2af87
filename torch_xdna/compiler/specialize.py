"""Run-time shape specialization for graphs Dynamo compiles with symbolic shapes.

NPU designs are planned for concrete shapes (tiling, capacity, DMA strides), so a symbolic graph
cannot be lowered as is. Instead, each distinct input signature (shapes, strides, dtypes, devices
of the tensors; values of the int/float/bool inputs, which is how SymInts arrive at run time) is
re-traced with those concrete values into a static core-ATen graph and compiled by the ordinary
static pipeline (partition, fuse, Program, disk cache). Compiled signatures live in a small LRU.
A signature that cannot be specialized runs the symbolic graph on the host, with a warning.
"""
from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from typing import Callable

import torch
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from torch_xdna.compiler import fusion
from torch_xdna.compiler.options import FallbackRefused

log = logging.getLogger("torch_xdna.compiler")
MAX_SIGNATURES = 8


def is_dynamic(gm: torch.fx.GraphModule) -> bool:
    """True if any placeholder is a SymInt or a tensor with symbolic sizes/strides."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(v, torch.Tensor) and not fusion.static_shape(v):
            return True
    return False


def signature(args) -> tuple:
    """What a specialized graph depends on: tensor geometry/dtype/device, scalar values."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type))
        elif isinstance(a, (bool, int, float)):
            sig.append((type(a).__name__, a))
        else:
            sig.append(type(a).__name__)
    return tuple(sig)


def describe(sig: tuple) -> str:
    """Tensor shapes and scalar values of a signature, for log lines and warnings."""
    parts = []
    for s in sig:
        if isinstance(s, tuple) and len(s) == 4:
            parts.append(str(list(s[0])))
        else:
            parts.append(repr(s[1]) if isinstance(s, tuple) else s)
    return ", ".join(parts)


def specialize(gm: torch.fx.GraphModule, args) -> torch.fx.GraphModule:
    """`gm` re-traced with `args`' concrete shapes: a static graph with literal sizes, keeping
    node metadata (module paths for precision rules)."""
    with torch.no_grad(), fx_traceback.preserve_node_meta():
        static = make_fx(torch.fx.Interpreter(gm).run, tracing_mode="fake")(*args)
    static.graph.eliminate_dead_code()          # make_fx leaves unused detach nodes
    static.recompile()
    return static


class Specializer:
    """Boxed forward function of a symbolic graph: compiles and dispatches per input signature."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, compile_fn: Callable,
                 max_signatures: int = MAX_SIGNATURES):
        self.gm = gm
        # GraphModule -> boxed callable: static graphs lower to the NPU, symbolic ones to the host
        self.compile_fn = compile_fn
        self.max = max_signatures
        self.compiled: OrderedDict[tuple, Callable] = OrderedDict()
        self._host: Callable | None = None

    def __call__(self, args: list):
        sig = signature(args)
        fn = self.compiled.get(sig)
        if fn is None:
            fn = self._build(sig, list(args))
            self.compiled[sig] = fn
            while len(self.compiled) > self.max:
                old, _ = self.compiled.popitem(last=False)
                log.info("xdna: dropped the least recently used specialization [%s]",
                         describe(old))
        else:
            self.compiled.move_to_end(sig)
        return fn(args)

    def _build(self, sig: tuple, args: list) -> Callable:
        log.info("xdna: compiling a specialization of a dynamic-shape graph for inputs [%s] "
                 "(%d cached)", describe(sig), len(self.compiled))
        try:
            return self.compile_fn(specialize(self.gm, args))
        except FallbackRefused:                 # fallback policy 'error': refuse, as today
            raise
        except Exception as e:                  # noqa: BLE001 - tracing/lowering failed: host
            return self._host_fallback(sig, e)

    def _host_fallback(self, sig: tuple, err: Exception) -> Callable:
        msg = (f"xdna compile: could not specialize a dynamic-shape graph for inputs "
               f"[{describe(sig)}] ({type(err).__name__}: {err}); for these shapes its nodes run "
               f"on the host. Use torch.compile(..., dynamic=False) to get one NPU program per "
               f"shape, or report the error.")
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        if self._host is None:
            self._host = self.compile_fn(self.gm)
        return self._host
