"""Table-defined vector-unit designs with one or more outputs (reductions with indices, sorts,
backward ops, losses, index writes).

`TableDesign` plans exactly like VectorDesign (operands streamed through up to every core; whole
rows in one core's L1 for row ops) and adds the bytes of every further output. Each op is defined
once with `define()`: its reference, its cost in vector passes per element, whether it is a row
op, and its operand numerics:

- "exact": compare/select/index/add-only ops keep fp32 operands (the accumulator path, as
  vector.EXACT_FP32);
- "bf16": floating operands enter as bf16 (RNE, subnormals flushed), math accumulates in fp32
  (kernels/numerics.py), the one policy of every multiplying kernel.
Integer and bool operands (indices, targets, masks) are passed unchanged.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.base import numel
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.runtime.plan import Plan


class TableOp(NamedTuple):
    fn: Callable                   # (operands, **params) -> tensor or tuple of tensors
    passes: float                  # vector passes per input element
    row: bool                      # a whole row (last `row_dims` dims) sits in one core's L1
    numerics: str                  # "exact" | "bf16"


TABLE: dict[str, TableOp] = {}


def define(name: str, fn: Callable, passes: float, row: bool = False,
           numerics: str = "bf16") -> None:
    if numerics not in ("exact", "bf16"):
        raise ValueError(f"vector op {name}: numerics {numerics!r} is not 'exact' or 'bf16'")
    TABLE[name] = TableOp(fn, passes, row, numerics)


@dataclass(frozen=True)
class TableDesign(VectorDesign):
    """One table op over fixed shapes/dtypes; `more_outs` are ((shape, dtype), ...) outputs
    after the first."""

    more_outs: tuple = ()
    kind = "vector"

    def _passes(self) -> float:
        # a size-dependent cost (a sort network over the row) comes in as the `passes` param
        return dict(self.params).get("passes", TABLE[self.op].passes)

    def _is_row_op(self) -> bool:
        return TABLE[self.op].row

    def _row_len(self) -> int:
        if not self._is_row_op() or not self.in_shapes or not self.in_shapes[0]:
            return 1
        nd = dict(self.params).get("row_dims", 1)
        return numel(self.in_shapes[0][-nd:])

    def _row_streams(self, in_b: int, out_b: int) -> tuple[int, int, int]:
        """Inputs and outputs the size of the first input stream row by row (grad and saved
        output of a backward op); smaller ones (statistics, weights) stay resident."""
        n0 = numel(self.in_shapes[0])
        ins = list(zip(self.in_shapes, self.in_dtypes))
        s_in = sum(d.itemsize for s, d in ins if numel(s) == n0)
        params = sum(numel(s) * d.itemsize for s, d in ins if numel(s) != n0)
        outs = [(self.out_shape, self.out_dtype)] + list(self.more_outs)
        s_out = sum(d.itemsize for s, d in outs if numel(s) == n0)
        params += sum(numel(s) * d.itemsize for s, d in outs if numel(s) != n0)
        return s_in, max(s_out, 1), params

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        op = TABLE[self.op]
        xs = []
        for x in inputs:
            if x.dtype in numerics.FLOAT_DTYPES:
                xs.append(x.float() if op.numerics == "exact" else numerics.operand(x))
            else:
                xs.append(x)
        kw = dict(self.params)
        kw.update(scalars)
        res = op.fn(xs, **kw)
        if not isinstance(res, (tuple, list)):
            res = (res,)
        for r, o in zip(res, outputs):
            if r is not None and o.numel():
                numerics.store(r.reshape(o.shape) if r.shape != o.shape else r, o)

    def plan(self, gen: Generation) -> Plan:
        p = super().plan(gen)
        extra = sum(numel(s) * d.itemsize for s, d in self.more_outs)
        return dataclasses.replace(p, dram_write_bytes=p.dram_write_bytes + extra) if extra else p
