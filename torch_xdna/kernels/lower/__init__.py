"""Lowering: each design family's plan -> ArrayPrograms (torch_xdna/array/ir.py).

`lower(design, gen)` returns the programs of one launch, run in order (most designs: one; a
GEMM with bias/residual adds an epilogue stage; fused LLM blocks run one program per stage with
a configure point between, intermediates in scratch host buffers named in each program's notes).
"""
from __future__ import annotations

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.lower.builder import LoweringError

__all__ = ["LoweringError", "lower", "lowerable"]


def lower(design, gen: Generation, **launch) -> tuple[ir.ArrayProgram, ...]:
    from torch_xdna.kernels.lower import families
    fn = families.LOWERINGS.get(design.kind)
    if fn is None:
        raise LoweringError(f"design kind {design.kind!r} ({design.name}) has no array lowering; "
                            f"lowered kinds: {', '.join(sorted(families.LOWERINGS))}")
    progs = fn(design, gen, **launch)
    return progs if isinstance(progs, tuple) else (progs,)


def lowerable(design) -> bool:
    from torch_xdna.kernels.lower import families
    return design.kind in families.LOWERINGS
