"""One launch of a table-defined vector design (kernels/ops/table.py) from an aten kernel.

Shared by the op-family modules (ops_reduce, ops_train, ops_misc): allocate or resize the outputs,
intern the design, launch. Kernels return None for dtypes the design does not take; the op table's
guard then applies the fallback policy.
"""
from __future__ import annotations

from typing import Sequence

import torch

from torch_xdna.device import storage
from torch_xdna.device.ops import _COMPUTE, design_for, launch
from torch_xdna.kernels.ops.table import TableDesign

FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, torch.dtype):
        return v
    return v


def output(out: torch.Tensor | None, shape, dtype: torch.dtype) -> torch.Tensor:
    """A fresh output, or `out` resized to `shape` (structured .out calls pass 0-size outs)."""
    if out is None:
        return storage.empty(list(shape), dtype)
    if tuple(out.shape) != tuple(shape):
        out.resize_(list(shape))
    return out


def run(op: str, inputs: Sequence[torch.Tensor], outs: Sequence, aten_name: str,
        design_cls=TableDesign, **params) -> list[torch.Tensor]:
    """Launch table op `op`; `outs` holds (shape, dtype) pairs or tensors to write."""
    tensors = [o if isinstance(o, torch.Tensor) else storage.empty(list(o[0]), o[1]) for o in outs]
    first = tensors[0]
    design = design_for(design_cls, op, tuple(tuple(t.shape) for t in inputs),
                        tuple(t.dtype for t in inputs), tuple(first.shape), first.dtype,
                        tuple(sorted((k, _freeze(v)) for k, v in params.items())),
                        tuple((tuple(t.shape), t.dtype) for t in tensors[1:]))
    launch(design, list(inputs), tensors, aten_name)
    return tensors


def ok(*tensors, floats_only: bool = False) -> bool:
    """All tensors are xdna tensors of dtypes the vector unit takes."""
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.device.type != "xdna":
            return False
        if t.dtype not in _COMPUTE or (floats_only and t.dtype not in FLOATS):
            return False
    return True


def norm_dims(x: torch.Tensor, dim) -> tuple[int, ...] | None:
    """Sorted non-negative dims, or None for 'all dims'."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return None
    nd = max(x.dim(), 1)
    return tuple(sorted({int(d) % nd for d in dim}))


def reduced_shape(x: torch.Tensor, dims, keepdim: bool) -> list[int]:
    if dims is None or x.dim() == 0:
        return [1] * x.dim() if keepdim else []
    return [1 if i in dims else s for i, s in enumerate(x.shape)] if keepdim else \
        [s for i, s in enumerate(x.shape) if i not in dims]
