"""The C++ core kernels, compiled for the host, as the emulated NPU's core kernels.

The emulated NPU (runtime/xrt/emulated/) runs an artifact's instruction stream at the transaction
level; where a core calls a kernel it must run what the chip runs: the aie2p/*.cc source of that
symbol, built with g++ against the aie_api emulation (host_build.py) with the tile defines the chip
build uses (kernels/aie.object_files on the program's declaration). This module installs the
resolver for those into runtime/sim/core_kernels.COMPILED (runtime/ cannot import kernels/).
Libraries are built on first use and cached (host_build's cache). Kernels generated per design
(fused chains) are not in the table and have no compiled form here.

`perturbed(symbol)` is a test hook: while it is active, every call of that kernel adds one unit
in the last place to the first element of its output, so a check that should catch a wrong
kernel can be shown to.
"""
from __future__ import annotations

import contextlib
import threading
from functools import lru_cache
from typing import Callable, Iterator

import torch

from torch_xdna.kernels import aie
from torch_xdna.kernels.aie import host_build
from torch_xdna.runtime.sim import core_kernels as ck

_perturbed: set[str] = set()
_lock = threading.Lock()


@lru_cache(maxsize=64)
def _library(source: str, defines: tuple[tuple[str, int], ...]):
    return host_build.load([source], dict(defines))


@lru_cache(maxsize=512)
def _bound(symbol: str, arg_types: tuple) -> Callable:
    """The callable of `symbol` built with the defines its declaration implies."""
    from torch_xdna.array.ir import KernelDecl
    decl = KernelDecl(symbol, f"{symbol}.o", arg_types)
    aie.check_decl(symbol, arg_types)
    _, source, defines = aie.object_files((decl,))[symbol]
    return host_build.bind(_library(source, tuple(defines)), symbol)


def _bump_last_place(out: torch.Tensor) -> None:
    """+1 ulp (floats) or +1 (integers) on element 0, through the integer view of its bits."""
    flat = out.reshape(-1)
    ints = {4: torch.int32, 2: torch.int16, 1: torch.int8}[flat.element_size()]
    flat[:1].view(ints).add_(1)


def resolve(symbol: str) -> ck.CoreKernel | None:
    """The host-compiled form of a table kernel (None for symbols the table does not know)."""
    if symbol not in aie.KERNELS:
        return None

    def run(*args, call, program) -> None:
        fn = _bound(symbol, program.kernel(call.kernel).arg_types)
        fn(*args)
        if symbol in _perturbed:
            _bump_last_place([a for a in args if isinstance(a, torch.Tensor)][-1])
    run.wants_call = True
    run.__name__ = symbol
    return run


@contextlib.contextmanager
def perturbed(symbol: str) -> Iterator[None]:
    """Test hook: make the compiled `symbol` wrong by one unit in the last place (see above)."""
    if symbol not in aie.KERNELS:
        raise KeyError(f"{symbol!r} is not a core kernel of the table")
    with _lock:
        _perturbed.add(symbol)
    try:
        yield
    finally:
        with _lock:
            _perturbed.discard(symbol)


ck.COMPILED.register_resolver(resolve)
