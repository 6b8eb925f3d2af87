"""Batched decode designs: one launch per layer advances N independent sequences by one token,
each with its own KV cache and position (continuous batching).

The weights stream once per step for all N rows (batch-N GEMMs); attention runs per sequence over
its own cache. The reference computes every row exactly as the batch-1 decode design does (row r
through AttentionBlockDesign/MlpBlockDesign with rows=1 at pos[r]): a GEMM tile's reduction order
does not depend on the other rows of the tile, so a row's results do not depend on its batch
partners, and each sequence's greedy tokens equal its tokens decoded alone.

Scalars: n (valid rows), slot (tuple: the KV slot of each row), pos (tuple: each row's position).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from torch_xdna.hw import Generation
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.blocks.llm import DecoderLayerDesign, HeadDesign
from torch_xdna.kernels.blocks.toolkit import KV_TILE, kv_bucket
from torch_xdna.runtime.plan import Plan


@dataclass(frozen=True)
class BatchedLayerDesign(Design):
    """A decoder layer over `rows` sequences. layer: the batch-1 DecoderLayerDesign (numerics);
    slots: KV slots bound to the launch.

    inputs: the layer's inputs (x [rows,H] first); outputs: x, k_0..k_{slots-1}, v_0..v_{slots-1}
    """

    layer: DecoderLayerDesign
    rows: int
    slots: int
    kind = "llm_layer_batch"

    @property
    def name(self) -> str:
        return f"{self.layer.name} batch={self.rows}"

    def reference(self, inputs, outputs, n: int = 1, slot: tuple = (), pos: tuple = (),
                  **_: Any) -> None:
        x, ks, vs = outputs[0], outputs[1:1 + self.slots], outputs[1 + self.slots:]
        for r in range(n):
            row = x[r:r + 1]
            self.layer.reference([row, *inputs[1:]], [row, ks[slot[r]], vs[slot[r]]],
                                 pos=pos[r], n=1)

    def _scaled(self, rows: int) -> DecoderLayerDesign:
        a, m = self.layer.attention, self.layer.mlp
        return DecoderLayerDesign(dataclasses.replace(a, rows=rows), dataclasses.replace(m, rows=rows))

    def plan(self, gen: Generation) -> Plan:
        return self.launch_plan(gen, n=self.rows, pos=(self.layer.attention.capacity - 1,) * self.rows)

    def runs(self) -> tuple:
        """The stages of the batch-`rows` layer it scales (it has no lowering of its own yet, so
        it is charged the configurations that layer's artifact runs)."""
        return self._scaled(self.rows).runs()

    def launch_plan(self, gen: Generation, n: int = 1, pos: tuple = (), **_: Any) -> Plan:
        """The batch-`rows` GEMMs with attention at the longest sequence's KV extent, plus the
        KV bytes of the other sequences' caches (each reads its own): weights stream once."""
        cache = self.__dict__.setdefault("_launch_plans", {})
        extents = tuple(sorted(kv_bucket(p + 1, self.layer.attention.capacity) for p in pos[:n]))
        key = (gen.name, extents)
        plan = cache.get(key)
        if plan is None:
            plan = cache[key] = self.plan_at(gen, extents)
        return plan

    def plan_at(self, gen: Generation, extents: tuple) -> Plan:
        a = self.layer.attention
        scaled = self._scaled(self.rows)
        base = scaled.combine(scaled.attention.plan_at(gen, max(extents), sequences=self.rows),
                              scaled.mlp.plan(gen))
        per_key = 2 * a.kv_heads * a.head_dim * a.cache_bytes
        keys = [e if a.window is None else min(e, a.window + KV_TILE) for e in extents]
        extra = per_key * (sum(keys) - max(keys))
        notes = dict(base.notes)
        stream_share = notes.get("stream_bytes", 0) / max(1, base.dram_read_bytes)
        notes["kv_read_bytes"] = notes.get("kv_read_bytes", 0) + extra
        notes["stream_bytes"] = int(notes.get("stream_bytes", 0) + stream_share * extra)
        return dataclasses.replace(base, dram_read_bytes=base.dram_read_bytes + extra, notes=notes)


@dataclass(frozen=True)
class BatchedHeadDesign(Design):
    """logits[r] = the batch-1 head of row r, for the first n rows. outputs: logits [rows, V]."""

    head: HeadDesign
    rows: int
    kind = "llm_head_batch"

    @property
    def name(self) -> str:
        return f"{self.head.name} batch={self.rows}"

    def reference(self, inputs, outputs, n: int = 1, **_: Any) -> None:
        for r in range(n):
            self.head.reference([inputs[0][r:r + 1], *inputs[1:]], [outputs[0][r:r + 1]], n=1)

    def plan(self, gen: Generation) -> Plan:
        return self.head.plan_rows(gen, self.rows, f"{self.name} vocab={self.head.vocab}", self.kind)

    def runs(self) -> tuple:
        """The batch-1 head's configurations (no lowering of its own yet)."""
        return self.head.runs()
