"""Multi-tensor elementwise designs: one `_foreach_*` op over a list of tensors in one launch.

Optimizers update every parameter with the same few ops (`_foreach_mul_`, `_foreach_add_`,
`_foreach_addcdiv_`, ...). Per tensor that is one launch each; as a ForeachDesign it is one
program that streams all the tensors' buffers through the cores (a chain of buffer descriptors
per operand list), plus one kernel call per tensor. Per-tensor scalars (Adam's bias corrections
change every step) are run-time arguments of the launch, not design parameters, so a new step
does not reconfigure the array. Numerics are those of the base op (vector.OPS or
vector_ops.TABLE).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.ops.vector import EXACT_FP32, OPS, VectorDesign
from torch_xdna.kernels.ops.table import TABLE
from torch_xdna.runtime.plan import Plan


def base_op(name: str):
    """(reference fn, passes, exact fp32 operands) of an elementwise base op."""
    if name in TABLE:
        t = TABLE[name]
        return t.fn, t.passes, t.numerics == "exact"
    fn, passes = OPS[name]
    return fn, passes, name in EXACT_FP32


@dataclass(frozen=True)
class ForeachDesign(VectorDesign):
    """`op` over `n` tensors; in_shapes/out_shape are the flat totals ((total,) per operand list).

    scalar_operand: the launch's per-tensor `values` are the last operand (add.Scalar,
    mul.ScalarList); param_name: else, when set, they fill this parameter of the base op
    (addcdiv value, lerp weight).
    """

    n: int = 1
    arity: int = 1
    scalar_operand: bool = False
    param_name: str = ""
    kind = "vector"

    @property
    def name(self) -> str:
        return f"foreach_{self.op}"

    def _passes(self) -> float:
        return base_op(self.op)[1]

    def _is_row_op(self) -> bool:
        return False

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  values: tuple = (), **scalars: Any) -> None:
        fn, _, exact = base_op(self.op)
        kw = dict(self.params)
        kw.update(scalars)
        for i in range(self.n):
            xs = [inputs[j * self.n + i] for j in range(self.arity)]
            if self.scalar_operand:
                xs.append(torch.tensor(float(values[i])))
            xs = [x.float() if exact or x.dtype not in numerics.FLOAT_DTYPES
                  else numerics.operand(x) for x in xs]
            if self.param_name:
                kw[self.param_name] = values[i]
            out = outputs[i]
            if out.numel():
                numerics.store(fn(xs, **kw).reshape(out.shape), out)

    def plan(self, gen: Generation) -> Plan:
        p = super().plan(gen)
        # one kernel call per tensor on top of the flat stream, spread over the cores
        extra = self.n * gen.kernel_call_cycles.value / max(1, p.cores)
        notes = dict(p.notes, tensors=self.n)
        return dataclasses.replace(p, compute_cycles=p.compute_cycles + extra, notes=notes)
