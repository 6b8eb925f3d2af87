"""Launch and Program: the units the runtime executes, counts, costs and traces."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from torch_xdna.runtime.buffer import TensorArg
from torch_xdna.runtime.plan import Plan


class DesignLike(Protocol):
    """What the runtime needs of a design (kernels/ implement it)."""

    @property
    def key(self) -> tuple: ...

    @property
    def name(self) -> str: ...

    def plan(self, gen) -> Plan: ...

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None: ...

    def artifact_key(self) -> str: ...


@dataclass(eq=False)
class Launch:
    """A design bound to buffers and scalar arguments."""

    design: DesignLike
    inputs: Sequence[TensorArg]
    outputs: Sequence[TensorArg]
    scalars: dict = field(default_factory=dict)
    op: str = ""          # the torch op or model site this launch serves (for the profiler)


@dataclass(eq=False)
class Program:
    """An ordered list of launches, run by one call into the runtime (chained dispatch)."""

    launches: list[Launch]
    name: str = "program"

    @property
    def key(self) -> tuple:
        """Identity of the program's ELF: its designs in order (one hardware context)."""
        return ("program",) + tuple(launch.design.key for launch in self.launches)
