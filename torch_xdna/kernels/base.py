"""Design: one NPU program identified by kind and static parameters.

A design owns its tiling plan (checked against the generation's limits), its reference
computation with the NPU's numerics (what `sim` executes), and its artifact identity (what `xrt`
looks up). Subclasses are frozen dataclasses, so equal parameters mean the same design.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.runtime.plan import Plan


class Design:
    """Base of all designs. Subclasses are `@dataclass(frozen=True)`."""

    kind: str = "design"

    @property
    def key(self) -> tuple:
        k = self.__dict__.get("_key")
        if k is None:
            k = (self.kind,) + tuple(_freeze(getattr(self, f.name)) for f in dataclasses.fields(self))
            object.__setattr__(self, "_key", k)
        return k

    @property
    def name(self) -> str:
        return self.kind

    def plan(self, gen: Generation) -> Plan:
        raise NotImplementedError

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        raise NotImplementedError

    def runs(self) -> tuple:
        """The array configurations one launch runs, in order: one per ArrayProgram its lowering
        returns (kernels/lower), each a kernel run of its artifact (kernels/toolchain). Equal
        entries are one configuration (a launch of layer i and one of layer j load the same).
        The cost model charges a kernel run per entry and a configure point per change."""
        return (self.key,)

    def artifact_key(self) -> str:
        """Stable identity of the hardware artifact that implements this design."""
        return f"{self.kind}-" + hashlib.sha256(repr(self.key).encode()).hexdigest()[:16]


def _freeze(v):
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    return v


def numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b
