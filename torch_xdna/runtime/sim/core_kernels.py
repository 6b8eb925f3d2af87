"""Core kernel references for the transaction-level simulator: kernel symbol -> torch function.

A compute core's program calls external kernels by symbol (ir.KernelDecl.symbol, the C++
function in kernels/aie/). The transaction level runs each call on the core's tile buffers with
the function registered here under that symbol. Functions take the call's arguments in order
(tile buffers as typed torch views, scalars as Python numbers) and write their outputs in place,
with the NPU's numerics. kernels/ registers them (it may import runtime/, not the reverse).
COMPILED holds the same symbols as host-compiled C++ (the emulated NPU runs those instead).
A function with attribute `wants_call = True` is also passed `call=` (the ir.Call, so it can tell
FIFO elements from scratch buffers) and `program=` (the ArrayProgram, for its notes).
"""
from __future__ import annotations

from typing import Callable

from torch_xdna.runtime.errors import XdnaError

CoreKernel = Callable[..., None]


class UnknownCoreKernel(XdnaError, KeyError):
    def __init__(self, symbol: str, kind: str = "reference", known: tuple[str, ...] = ()):
        hint = ("register one with torch_xdna.runtime.sim.core_kernels.register" if kind == "reference"
                else "the kernels layer installs them (import torch_xdna.kernels)")
        super().__init__(
            f"xdna txn sim: no {kind} registered for core kernel {symbol!r}; {hint} (known: "
            f"{', '.join(sorted(known)) or 'none'})")

    def __str__(self) -> str:       # KeyError would quote the message
        return self.args[0]


class KernelRegistry:
    """symbol -> implementation, plus resolvers for families of symbols (looked up once)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._registry: dict[str, CoreKernel] = {}
        self._resolvers: list[Callable[[str], "CoreKernel | None"]] = []

    def register(self, symbol: str, fn: CoreKernel | None = None):
        """Register `fn` as core kernel `symbol` (usable as a decorator)."""
        def deco(f: CoreKernel) -> CoreKernel:
            self._registry[symbol] = f
            return f
        return deco(fn) if fn is not None else deco

    def register_resolver(self, fn: Callable[[str], "CoreKernel | None"]) -> None:
        """A family of symbols (e.g. `store_<act>_<acc>_<out>`): fn(symbol) -> kernel or None."""
        if fn not in self._resolvers:
            self._resolvers.append(fn)

    def lookup(self, symbol: str) -> CoreKernel:
        hit = self._registry.get(symbol)
        if hit is not None:
            return hit
        for r in self._resolvers:
            fn = r(symbol)
            if fn is not None:
                self._registry[symbol] = fn
                return fn
        raise UnknownCoreKernel(symbol, self.kind, tuple(self._registry))

    def registered(self) -> tuple[str, ...]:
        return tuple(sorted(self._registry))


# torch references with the NPU's numerics: the transaction level of `sim`
REFERENCES = KernelRegistry("reference")
# the C++ core kernels compiled for the host (kernels/aie/host_kernels.py): the emulated NPU
COMPILED = KernelRegistry("host-compiled C++ kernel")
register = REFERENCES.register
register_resolver = REFERENCES.register_resolver
lookup = REFERENCES.lookup
registered = REFERENCES.registered
