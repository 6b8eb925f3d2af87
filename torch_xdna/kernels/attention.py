"""Attention with the NPU's numerics (bf16 operands, fp32 accumulation and softmax).

`attention_reference` is shared by every design that contains attention (AttentionDesign below,
the fused LLM and encoder blocks): keep its signature stable. AttentionDesign is attention as one
launch (QK^T, scale, causal/additive mask, softmax, @V, grouped-query heads, a KV length given at
launch time) with its plan, so the compiler and the engines can fuse attention into one dispatch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.base import Design, ceil_div, round_up
from torch_xdna.kernels.capacity import DmaTransfer, check_dma, check_plan, lanes, need, \
    require_dtype
from torch_xdna.runtime.plan import Plan
from torch_xdna.runtime.sim.cost import compute_efficiency, dram_time_s


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                        causal: bool = False, mask: torch.Tensor | None = None,
                        q_offset: int = 0, window: int | None = None,
                        softcap: float | None = None, rounded: bool = False) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (GQA when Hq > Hkv).

    causal: query i (at absolute position q_offset + i) sees keys 0..q_offset+i.
    window: sliding window size (keys older than pos - window + 1 are masked).
    rounded: q, k, v already are operands (numerics.operand of them): rounding is not redone.
    Returns fp32 [B,Hq,Sq,D].
    """
    if not rounded:
        q, k, v = numerics.operand(q), numerics.operand(k), numerics.operand(v)
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)    # in place: the same values
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    sq, skv = s.shape[-2], s.shape[-1]
    if causal or window is not None:
        qpos = torch.arange(sq).unsqueeze(1) + q_offset
        kpos = torch.arange(skv).unsqueeze(0)
        allowed = torch.ones(sq, skv, dtype=torch.bool)
        if causal:
            allowed &= kpos <= qpos
        if window is not None:
            allowed &= kpos > qpos - window
        s = s.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        s = s + mask.float()
    p = torch.softmax(s, dim=-1)
    p = torch.nan_to_num_(p, nan=0.0)           # fully-masked rows give zeros, not NaN
    return torch.matmul(numerics.operand_nonneg(p), v)


# --- the fused attention design -----------------------------------------------------------------
Q_TILES = (64, 32, 16, 8, 4, 2, 1)       # query rows per head in one core's work item
KV_TILES = (256, 128, 64, 32, 16)        # keys per pass over the K/V stream
SOFTMAX_PASSES = 6                       # vector ops per score: scale, mask, max, exp, sum, scale
_LAUNCH_PLANS: dict[tuple, Plan] = {}


@dataclass(frozen=True)
class AttentionDesign(Design):
    """softmax(scale * Q K^T (+ causal mask) (+ mask)) V as ONE launch.

    inputs: q [B, Hq, Lq, D], k [B, Hkv, S, D], v [B, Hkv, S, D], then mask (broadcastable to
    [B, Hq, Lq, S]) when `mask` is set: additive, or boolean (True = attend, as torch SDPA) with
    `mask_bool`; output [B, Hq, Lq, D]. Hq must be a multiple of Hkv (grouped-query attention:
    the heads of a group share the K/V stream).
    Launch scalars: kv_len (valid keys, default S: a KV cache of capacity S serves every step
    with one design), q_offset (absolute position of query 0, default kv_len - Lq, i.e. the
    queries are the newest tokens: causal masking is bottom-right aligned). `top_left` makes the
    default q_offset 0 instead: query i sees keys 0..i, torch SDPA's `is_causal` (the compiler's
    case; the two agree when Lq == S).
    Mapping: a work item is one KV head x a tile of tq query rows of each head in its group,
    flash-style: the K/V stream passes in tkv-key tiles, scores stay in L1, softmax runs online
    in fp32 on the vector unit, P (bf16) @ V accumulates in fp32.
    """

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool = False
    mask: bool = False
    mask_shape: tuple = ()          # the mask's shape (default [1, 1, Lq, S])
    scale: float = 0.0              # 0: 1/sqrt(head_dim)
    window: int = 0                 # sliding window (0: none)
    softcap: float = 0.0            # tanh soft-capping of scores (0: none)
    in_dtype: torch.dtype = torch.bfloat16
    out_dtype: torch.dtype = torch.float32
    mask_bool: bool = False         # the mask is boolean (True = attend), else additive
    top_left: bool = False          # default q_offset 0 (torch SDPA is_causal), else kv_len - Lq
    kind = "attention"

    def __post_init__(self):
        if self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise ValueError(f"AttentionDesign: heads={self.heads} is not a multiple of "
                             f"kv_heads={self.kv_heads}")
        if min(self.batch, self.q_len, self.kv_len, self.head_dim) <= 0:
            raise ValueError("AttentionDesign: batch, q_len, kv_len and head_dim must be positive")

    @property
    def name(self) -> str:
        extra = "".join(f"+{x}" for x, on in (("causal", self.causal), ("mask", self.mask),
                                                ("gqa", self.heads != self.kv_heads)) if on)
        return f"attention{extra}"

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def softmax_scale(self) -> float:
        return self.scale or 1.0 / math.sqrt(self.head_dim)

    # -- numerics ---------------------------------------------------------------------------
    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  kv_len: int | None = None, q_offset: int | None = None, **scalars: Any) -> None:
        q, k, v, *rest = inputs
        n = self.kv_len if kv_len is None else int(kv_len)
        if not 0 < n <= self.kv_len:
            raise ValueError(f"attention: kv_len={n} outside 1..{self.kv_len} (the design's KV "
                             f"capacity)")
        mask = rest[0][..., :n] if self.mask else None
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
        offset = self._offset(n) if q_offset is None else int(q_offset)
        out = attention_reference(q, k[..., :n, :], v[..., :n, :], scale=self.softmax_scale,
                                  causal=self.causal, mask=mask, q_offset=offset,
                                  window=self.window or None, softcap=self.softcap or None)
        numerics.store(out, outputs[0])

    def _offset(self, kv_valid: int) -> int:
        """Absolute position of query 0 when the launch gives no q_offset."""
        return 0 if self.top_left else kv_valid - self.q_len

    # -- planning ---------------------------------------------------------------------------
    def plan(self, gen: Generation) -> Plan:
        return self.plan_for(gen)

    def _mask_elems(self, kv_valid: int) -> int:
        """Distinct mask elements streamed: a broadcast mask (e.g. a [B,1,1,S] padding mask) is
        read once and re-used on chip, not once per head and query."""
        shape = tuple(self.mask_shape) or (1, 1, self.q_len, self.kv_len)
        n = 1
        for s_ in shape[:-1]:
            n *= s_
        return n * (kv_valid if shape[-1] != 1 else 1)

    def launch_plan(self, gen: Generation, **scalars: Any) -> Plan:
        """The plan of one launch given its scalars (the cost at its valid KV length)."""
        n = scalars.get("kv_len")
        key = (self.key, gen.name, None if n is None else int(n))
        plan = _LAUNCH_PLANS.get(key)
        if plan is None:
            if len(_LAUNCH_PLANS) > 4096:
                _LAUNCH_PLANS.clear()
            plan = _LAUNCH_PLANS[key] = self.plan_for(gen, None if n is None else int(n))
        return plan

    def plan_for(self, gen: Generation, kv_len: int | None = None) -> Plan:
        """The plan at `kv_len` valid keys (default: the capacity). The tiling is chosen once
        at capacity, so every step of a KV cache maps the same way; only the bytes and cycles
        shrink with the valid length."""
        label = (f"{self.name} B{self.batch} H{self.heads}/{self.kv_heads} Lq{self.q_len} "
                 f"S{self.kv_len} D{self.head_dim}")
        rm, rk, _ = require_dtype(gen, label, "bf16")
        check_dma(gen, label, (DmaTransfer("K/V rows: stride D", (self.kv_len, self.head_dim),
                                           (self.head_dim, 1)),))
        best = None
        for tq in Q_TILES:
            if tq > self.q_len and tq > 1:
                continue
            for tkv in KV_TILES:
                if tkv > round_up(self.kv_len, KV_TILES[-1]) and tkv > KV_TILES[-1]:
                    continue
                l1 = self._l1(tq, tkv, rm, rk)
                if l1 > gen.l1_usable:
                    continue
                cand = self._evaluate(gen, tq, tkv, l1, self.kv_len, rm, rk)
                if best is None or cand[0] < best[0]:
                    best = cand
        if best is None:
            need(label, "L1 data memory per core (query rows of a head group + K/V tiles)",
                 self._l1(1, KV_TILES[-1], rm, rk), gen.l1_usable,
                 "use a smaller head_dim or fewer query heads per KV head")
        plan = best[1]
        if kv_len is not None and kv_len != self.kv_len:
            if not 0 < kv_len <= self.kv_len:
                raise ValueError(f"attention: kv_len={kv_len} outside 1..{self.kv_len}")
            tq, tkv, _ = plan.tile
            plan = self._evaluate(gen, tq, tkv, plan.l1_bytes, kv_len, rm, rk)[1]
        return check_plan(gen, label, plan)

    def _l1(self, tq: int, tkv: int, rm: int, rk: int) -> int:
        rows = round_up(self.group * tq, rm)
        d = round_up(self.head_dim, rk)
        l1 = (rows * d * 2                      # Q rows (bf16)
              + 2 * 2 * tkv * d * 2             # K and V tiles, double-buffered (bf16)
              + rows * tkv * (4 + 2)            # scores (fp32) and P (bf16)
              + rows * d * 4                    # output accumulator (fp32)
              + rows * 2 * 4)                   # running max and sum
        if self.mask:
            l1 += 2 * rows * tkv * 4
        return l1

    def _evaluate(self, gen: Generation, tq: int, tkv: int, l1: int, kv_valid: int, rm: int,
                  rk: int):
        b, hq, hkv, lq, d = self.batch, self.heads, self.kv_heads, self.q_len, self.head_dim
        q_tiles = ceil_div(lq, tq)
        items = b * hkv * q_tiles
        cores = min(gen.cores, items)
        cols = min(gen.columns.value, ceil_div(cores, gen.core_rows.value))
        # keys each query tile must visit (causal: up to its last row; window: from its first)
        offset = self._offset(kv_valid)
        visit = 0
        for i in range(q_tiles):
            hi = min(kv_valid, offset + min(lq, (i + 1) * tq)) if self.causal else kv_valid
            lo = max(0, offset + i * tq - self.window + 1) if self.window else 0
            visit += max(0, round_up(hi, tkv) - lo // tkv * tkv)
        visit = min(visit, q_tiles * round_up(kv_valid, tkv))
        rows = round_up(self.group * tq, rm)
        dp = round_up(d, rk)
        macs_item = 2 * rows * dp * visit / q_tiles
        rate = gen.macs_per_core_cycle.value["bf16"] * compute_efficiency(gen, "bf16")
        vec = SOFTMAX_PASSES * rows * visit / q_tiles / lanes(gen, 32)
        calls = visit / q_tiles / tkv * 2 * gen.kernel_call_cycles.value
        cycles = ceil_div(items, cores) * (macs_item / rate + vec + calls)
        # K/V stream: once per work item, shared by the cores of a column on the same KV head
        share = max(1, min(gen.core_rows.value, q_tiles))
        kv_bytes = b * hkv * visit * d * 2 * 2 / share
        q_bytes = b * hq * lq * d * self.in_dtype.itemsize
        mask_bytes = self._mask_elems(kv_valid) * (1 if self.mask_bool else 4) if self.mask else 0
        read = q_bytes + kv_bytes + mask_bytes
        write = b * hq * lq * d * self.out_dtype.itemsize
        t_dram = dram_time_s(gen, cols, read, write)
        t_comp = cycles / gen.core_clock_hz.value
        fill = dram_time_s(gen, cols, 2 * tkv * d * 2 * cols, 0) + t_comp / max(1, items / cores) \
            / max(1, visit / q_tiles / tkv)
        depth = gen.shim_task_queue_depth.value
        tasks = b * hkv                             # one task per KV head stream and channel
        plan = Plan(
            design="attention", dtype="bf16", columns=cols, cores=cores, tile=(tq, tkv, d),
            l1_bytes=l1, memtile_bytes=2 * 2 * tkv * d * 2 + 2 * rows * d * 2 * gen.core_rows.value,
            core_bds=2 * 4 + (2 if self.mask else 0), memtile_bds=2 * (4 + gen.core_rows.value),
            core_locks=2 * 4 + (2 if self.mask else 0), shim_tasks=min(depth, tasks),
            double_buffered=True, dram_read_bytes=int(read), dram_write_bytes=int(write),
            macs=2 * b * hq * lq * kv_valid * d, padded_macs=int(macs_item * items),
            vector_elems=int(SOFTMAX_PASSES * b * hq * lq * visit / q_tiles),
            compute_cycles=cycles,
            dma_shapes=(DmaTransfer("Q tile", (self.group, tq, d), (lq * d, d, 1)),
                        DmaTransfer("K/V stream", (ceil_div(kv_valid, tkv), tkv, d), (tkv * d, d, 1)),
                        DmaTransfer("O tile", (self.group, tq, d), (lq * d, d, 1))),
            notes={"work_items": items, "kv_visited_per_q_tile": visit / q_tiles,
                   "kv_share": share, "fill_s": fill, "shim_task_batches": ceil_div(tasks, depth),
                   "memtile_locks": 2 * (4 + gen.core_rows.value),
                   "core_dma": (2, 1), "memtile_dma": (3, 2), "shim_dma": (2, 1)})
        return max(t_dram, t_comp) + fill, plan
