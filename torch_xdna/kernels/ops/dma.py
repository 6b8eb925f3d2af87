"""Data-movement designs: concatenation and index gathers, done by the DMA engines alone.

No core computes: shim and mem-tile DMAs move contiguous runs of the source into the output
(one buffer descriptor per run), so the cost is the bytes moved plus descriptor traffic, and the
result is bit-exact in every dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels.base import Design, ceil_div, numel
from torch_xdna.kernels.capacity import DmaTransfer, check_plan
from torch_xdna.runtime.plan import Plan


def dma_runs_plan(gen: Generation, label: str, design: str, runs: int, run_elems: int,
                  itemsize: int, read: int, write: int) -> Plan:
    """`runs` BDs of `run_elems` elements each, ping-ponged through one column's mem tile; a shim
    task carries as many run BDs as the mem tile has left, tasks beyond the queue depth wait."""
    runs = max(1, runs)
    run_bytes = max(1, run_elems) * itemsize
    per_task = gen.memtile_bds.value // 2
    tasks = ceil_div(runs, per_task)
    depth = gen.shim_task_queue_depth.value
    plan = Plan(design=design, dtype="dma", columns=1, cores=0, tile=(max(1, run_elems),),
                memtile_bytes=min(2 * run_bytes, gen.memtile_bytes.value),
                memtile_bds=min(runs, per_task) * 2, shim_tasks=min(depth, tasks),
                double_buffered=True, dram_read_bytes=read, dram_write_bytes=write,
                compute_cycles=0.0,
                dma_shapes=(DmaTransfer("run", (1, max(1, run_elems)), (max(1, run_elems), 1)),),
                notes={"shim_task_batches": ceil_div(tasks, depth), "memtile_locks": 4,
                       "memtile_dma": (1, 1), "shim_dma": (2, 1), "runs": runs})
    return check_plan(gen, label, plan)


@dataclass(frozen=True)
class ConcatDesign(Design):
    """out = cat(inputs, dim): each input lands in its slice of the output by strided BDs."""

    in_shapes: tuple
    dtype: torch.dtype
    dim: int
    out_shape: tuple
    kind = "concat"

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        out, off = outputs[0], 0
        for x in inputs:
            n = x.shape[self.dim] if x.dim() else 0
            if x.numel():
                out.narrow(self.dim, off, n).copy_(x)
            off += n

    def plan(self, gen: Generation) -> Plan:
        label = f"concat {list(self.in_shapes)} dim {self.dim} -> {self.out_shape}"
        item = self.dtype.itemsize
        inner = numel(self.out_shape[self.dim + 1:])
        outer = numel(self.out_shape[:self.dim])
        runs = sum(outer for s in self.in_shapes if numel(s))     # one BD run per outer row
        run = max((s[self.dim] * inner for s in self.in_shapes if numel(s)), default=1)
        total = numel(self.out_shape) * item
        return dma_runs_plan(gen, label, "concat", runs, run, item, total, total)


GATHER_MODES = ("index_select", "gather", "index")


@dataclass(frozen=True)
class GatherDesign(Design):
    """Index gathers: index_select along a dim, gather along a dim, or advanced indexing
    (`x[i0, i1, ...]`, `params` marks which index slots are None). The indices are read by the
    shim DMA's descriptor generation; each gathered contiguous run is one BD."""

    mode: str
    in_shapes: tuple                 # source, then the index tensors
    dtype: torch.dtype
    out_shape: tuple
    params: tuple = ()               # sorted (name, value): dim, or none_slots for index
    kind = "gather"

    @property
    def name(self) -> str:
        return self.mode

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        p = dict(self.params)
        x, idx = inputs[0], list(inputs[1:])
        if self.mode == "index_select":
            r = torch.index_select(x, p["dim"], idx[0].long())
        elif self.mode == "gather":
            r = torch.gather(x, p["dim"], idx[0].long())
        else:
            it = iter(i.long() if i.dtype != torch.bool else i for i in idx)
            full = [None if k in p["none_slots"] else next(it) for k in range(p["n_slots"])]
            r = torch.ops.aten.index.Tensor(x, full)
        outputs[0].copy_(r)

    def plan(self, gen: Generation) -> Plan:
        label = f"{self.mode} {self.in_shapes[0]} by {list(self.in_shapes[1:])} -> {self.out_shape}"
        p = dict(self.params)
        item = self.dtype.itemsize
        n_out = numel(self.out_shape)
        src = self.in_shapes[0]
        if self.mode == "index_select":
            run = numel(src[p["dim"] + 1:])          # one source row per index
        elif self.mode == "index":
            slots = p["n_slots"]
            run = numel(src[slots:]) if not any(k in p["none_slots"] for k in range(slots)) else 1
        else:
            run = 1                                   # gather picks single elements
        run = max(1, run)
        idx_bytes = sum(numel(s) * 8 for s in self.in_shapes[1:])
        return dma_runs_plan(gen, label, self.mode, ceil_div(n_out, run), run, item,
                         n_out * item + idx_bytes, n_out * item)
