"""The generation whose plans fix the accumulation order of the functional references.

A float reduction's result depends on its order, and the order is the plan's (a GEMM adds fp32
partial sums K tile by K tile, kernels/numerics.ktile_matmul). The functional level calls a
design's `reference(inputs, outputs)`, which has no generation argument, so the simulator device
says here which generation it simulates; references called outside a device use NPU4.
"""
from __future__ import annotations

import contextlib
import threading

from torch_xdna.hw import NPU4, Generation

_state = threading.local()


def generation() -> Generation:
    return getattr(_state, "gen", None) or NPU4


@contextlib.contextmanager
def using(gen: Generation):
    prev = getattr(_state, "gen", None)
    _state.gen = gen
    try:
        yield gen
    finally:
        _state.gen = prev
