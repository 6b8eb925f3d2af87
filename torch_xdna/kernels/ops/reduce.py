"""Reductions with indices, selections and moments on the vector unit (TableDesign ops).

argmax/argmin, max/min along a dim (values + first index, as PyTorch), full max/min, topk and
sort (a row per core: a bitonic network over the row in L1, ~log2(n)^2 / 2 compare-exchange
passes), and var/std/var_mean/std_mean (two passes: mean, then squared deviations accumulated
in fp32). Compares and selects keep fp32 operands (exact); moments use bf16 operands.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels.base import ceil_div, numel
from torch_xdna.kernels.capacity import need
from torch_xdna.kernels.ops.table import TableDesign, define
from torch_xdna.runtime.plan import Plan, PlanError


def _dims(x: torch.Tensor, dims):
    return tuple(range(x.dim())) if dims is None or dims == () else dims


def _arg(fn):
    def run(xs, dim=None, keepdim=False, **kw):
        x = xs[0]
        if dim is None:
            return fn(x.reshape(-1), 0) if x.dim() else fn(x.reshape(1), 0).reshape(())
        r = fn(x, dim, keepdim=keepdim) if x.dim() else fn(x.reshape(1), 0).reshape(())
        return r
    return run


def _minmax_dim(fn):
    def run(xs, dim, keepdim=False, **kw):
        x = xs[0]
        if not x.dim():
            return x, torch.zeros((), dtype=torch.int64)
        r = fn(x, dim, keepdim=keepdim)
        return r.values, r.indices
    return run


def _topk(xs, k, largest=True, sorted=True, **kw):
    r = torch.topk(xs[0], k, dim=-1, largest=largest, sorted=sorted)
    return r.values, r.indices


def _sort(xs, descending=False, stable=False, **kw):
    r = torch.sort(xs[0], dim=-1, descending=descending, stable=stable)
    return r.values, r.indices


def _moment(kind: str):
    def run(xs, dims=None, correction=1.0, keepdim=False, **kw):
        x = xs[0]
        d = _dims(x, dims) if x.dim() else None
        if d is None:
            v = torch.var(x.reshape(1), correction=correction)
            m = x
        else:
            v = torch.var(x, dim=d, correction=correction, keepdim=keepdim)
            m = torch.mean(x, dim=d, keepdim=keepdim)
        s = torch.sqrt(v) if kind.startswith("std") else v
        return (s, m) if kind.endswith("_mean") else s
    return run


def sort_passes(n: int) -> float:
    """Compare-exchange passes of a bitonic sort network over a row of n elements."""
    lg = max(1, math.ceil(math.log2(max(2, n))))
    return lg * (lg + 1) / 2


define("argmax", _arg(torch.argmax), 1, numerics="exact")
define("argmin", _arg(torch.argmin), 1, numerics="exact")
define("max_dim", _minmax_dim(torch.max), 1, numerics="exact")
define("min_dim", _minmax_dim(torch.min), 1, numerics="exact")
define("max_all", lambda xs, **kw: torch.max(xs[0]), 1, numerics="exact")
define("min_all", lambda xs, **kw: torch.min(xs[0]), 1, numerics="exact")
define("amin", lambda xs, dims, keepdim, **kw: torch.amin(xs[0], _dims(xs[0], dims), keepdim)
       if xs[0].dim() else xs[0], 1, numerics="exact")
# row ops: the op layer passes the row's network depth as `passes` (sort_passes(row length))
define("topk", _topk, 1, row=True, numerics="exact")
define("sort", _sort, 1, row=True, numerics="exact")
define("var", _moment("var"), 3)
define("std", _moment("std"), 4)
define("var_mean", _moment("var_mean"), 3)
define("std_mean", _moment("std_mean"), 4)


def _vector_norm(xs, ord, dims=None, keepdim=False, **kw):
    x = xs[0]
    return torch.linalg.vector_norm(x, ord, dim=dims if dims else None, keepdim=keepdim)


# |x|^p summed in fp32 on bf16 operands, then the p-th root (2-norm: squares and a sqrt)
define("vector_norm", _vector_norm, 3)
# max/min |x| (ord = +-inf) and the count of nonzeros (ord = 0) only compare: exact, so the
# backward's `|x| == norm` mask finds the maximum
define("vector_norm_select", _vector_norm, 1, numerics="exact")


@dataclass(frozen=True)
class SortDesign(TableDesign):
    """sort / topk over rows. A row that fits one core's L1 is sorted there (a bitonic network);
    a longer row is sorted in L1-sized runs by the cores of one column and merged in that
    column's mem tile (log2(runs) merge passes streaming through the cores), so a row must fit
    the mem tile (values and indices, in and out)."""

    def plan(self, gen: Generation) -> Plan:
        try:
            return super().plan(gen)
        except PlanError as e:
            if "L1" not in e.limit:
                raise
        row = self._row_len()
        label = f"{self.op} {self.in_shapes}->{self.out_shape}"
        in_b, out_b, _ = self._row_streams(self.in_dtypes[0].itemsize, self.out_dtype.itemsize)
        need(label, f"mem tile memory (per column: one {self.op} row of {row} elements, merged)",
             row * (in_b + out_b), gen.memtile_bytes.value,
             "rows this long sort on the host; split the row")
        per = in_b + out_b + (0 if in_b == 4 else 4)     # + an fp32 working row, as in L1 rows
        run = 1 << max(1, (gen.l1_usable // per).bit_length() - 1)
        while run * per > gen.l1_usable:
            run //= 2
        runs = ceil_div(row, run)
        merges = max(1, (runs - 1).bit_length())
        passes = sort_passes(run) + 2 * merges
        rows = numel(self.in_shapes[0]) // row
        sub = TableDesign(self.op, ((rows * runs, run),), self.in_dtypes[:1], (rows * runs, run),
                          self.out_dtype, tuple(p for p in self.params if p[0] != "passes")
                          + (("passes", float(passes)),), tuple(((rows * runs, run), d)
                                                                for _, d in self.more_outs))
        p = sub.plan(gen)
        notes = dict(p.notes, merge_runs=runs, merge_passes=merges)
        return dataclasses.replace(p, memtile_bytes=row * (in_b + out_b), notes=notes)
