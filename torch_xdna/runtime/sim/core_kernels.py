"""Core kernel references for the transaction-level simulator: kernel symbol -> torch function.

A compute core's program calls external kernels by symbol (ir.KernelDecl.symbol, the C++
function in kernels/aie/). The transaction level runs each call on the core's tile buffers with
the function registered here under that symbol. Functions take the call's arguments in order
(tile buffers as typed torch views, scalars as Python numbers) and write their outputs in place,
with the NPU's numerics. kernels/ registers them (it may import runtime/, not the reverse).
A function with attribute `wants_call = True` is also passed `call=` (the ir.Call, so it can tell
FIFO elements from scratch buffers) and `program=` (the ArrayProgram, for its notes).
"""
from __future__ import annotations

from typing import Callable

from torch_xdna.runtime.errors import XdnaError

CoreKernel = Callable[..., None]
_REGISTRY: dict[str, CoreKernel] = {}
_RESOLVERS: list[Callable[[str], "CoreKernel | None"]] = []


class UnknownCoreKernel(XdnaError, KeyError):
    def __init__(self, symbol: str):
        super().__init__(
            f"xdna txn sim: no reference registered for core kernel {symbol!r}; register one with "
            f"torch_xdna.runtime.sim.core_kernels.register({symbol!r}) (known: "
            f"{', '.join(sorted(_REGISTRY)) or 'none'})")

    def __str__(self) -> str:       # KeyError would quote the message
        return self.args[0]


def register(symbol: str, fn: CoreKernel | None = None):
    """Register `fn` as the reference of core kernel `symbol` (usable as a decorator)."""
    def deco(f: CoreKernel) -> CoreKernel:
        _REGISTRY[symbol] = f
        return f
    return deco(fn) if fn is not None else deco


def register_resolver(fn: Callable[[str], "CoreKernel | None"]) -> None:
    """A family of symbols (e.g. `store_<act>_<acc>_<out>`): fn(symbol) -> reference or None."""
    if fn not in _RESOLVERS:
        _RESOLVERS.append(fn)


def lookup(symbol: str) -> CoreKernel:
    hit = _REGISTRY.get(symbol)
    if hit is not None:
        return hit
    for r in _RESOLVERS:
        fn = r(symbol)
        if fn is not None:
            _REGISTRY[symbol] = fn
            return fn
    raise UnknownCoreKernel(symbol)


def registered() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))
