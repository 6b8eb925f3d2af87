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
from torch_xdna.hw.vector_costs import ATTENTION_SOFTMAX, BF16_LANES
from torch_xdna.kernels import numerics
from torch_xdna.kernels.base import Design, ceil_div, round_up
from torch_xdna.kernels.capacity import DmaTransfer, check_dma, check_plan, lanes, need, \
    require_dtype
from torch_xdna.runtime.plan import Plan
from torch_xdna.runtime.sim import order
from torch_xdna.runtime.sim.cost import compute_efficiency, dram_time_s, kv_tile_pass_cycles


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


def flash_tile(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
               mask: torch.Tensor | None, o: torch.Tensor, m: torch.Tensor, l: torch.Tensor,
               scale: float, softcap: float | None):
    """One key tile of flash attention as a core runs it (the online-softmax update), shared by
    AttentionDesign.reference and the core kernel's reference, so both levels agree bit for bit.

    q [.., r, D], k / v [.., t, D] as operands; allowed bool and mask (additive fp32) broadcast
    to [.., r, t]; o [.., r, D], m / l [.., r] the running output, max and sum (fp32).
    s = scale * q k^T (an exact tile product rounded to fp32, numerics.tile_dot), softcapped,
    masked; m' = max(m, max s); P = bf16(exp(s - m')); l' = l e^(m - m') + sum P (exact sum,
    rounded once); o' = o e^(m - m') + P V (tile_dot). Returns (o', m', l', s, P)."""
    sc = numerics.tile_dot(q, k.transpose(-1, -2)) * scale
    if softcap:
        sc = torch.tanh(sc / softcap) * softcap
    sc = sc.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        sc = sc + mask
    m_new = torch.maximum(m, sc.amax(dim=-1))
    safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
    p = numerics.operand(torch.exp(sc - safe.unsqueeze(-1)))          # bf16 P, masked -> 0
    alpha = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - safe))
    l_new = l * alpha + p.double().sum(dim=-1).float()
    o_new = o * alpha.unsqueeze(-1) + numerics.tile_dot(p, v)
    return o_new, m_new, l_new, sc, p


def flash_finish(o: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """o / l per row; rows that saw no key (l == 0) give zeros."""
    l = l.unsqueeze(-1)                                               # noqa: E741
    return torch.where(l > 0, o / torch.where(l > 0, l, torch.ones_like(l)), torch.zeros_like(o))


def design_order_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tkv: int, *, scale: float,
                    causal: bool = False, mask: torch.Tensor | None = None, q_offset: int = 0,
                    window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """attention_reference's result in the design's order: key tiles of `tkv` from key 0, each
    folded in by flash_tile, the query heads of a KV group stacked as one core's rows.
    q [B,Hq,Lq,D], k / v [B,Hkv,S,D], mask broadcastable to [B,Hq,Lq,S]; returns fp32 [B,Hq,Lq,D]."""
    q, k, v = numerics.operand(q), numerics.operand(k), numerics.operand(v)
    B, hq, lq, d = q.shape
    hkv, S = k.shape[1], k.shape[2]
    g = hq // hkv
    rows = g * lq
    qg = q.reshape(B, hkv, rows, d)
    if mask is not None:
        mask = mask.float().expand(B, hq, lq, S).reshape(B, hkv, rows, S)
    qpos = (torch.arange(rows) % lq).unsqueeze(1) + q_offset
    # Everything but the two running sums is order-free, so it is computed for all key tiles at
    # once with the same elementwise ops and exact (tile_dot / fp64) products as flash_tile:
    # scores (one exact dot over D per key), tile maxima, the running max (cummax), P, the
    # rescale factors, the tiles' row sums and P V; then l and o are folded tile by tile.
    T = -(-S // tkv)
    pad = T * tkv - S
    sc = numerics.tile_dot(qg, k.transpose(-1, -2)) * scale                    # [B,hkv,rows,S]
    if softcap:
        sc = torch.tanh(sc / softcap) * softcap
    kp = torch.arange(S).unsqueeze(0)
    allowed = torch.ones(rows, S, dtype=torch.bool)
    if causal:
        allowed = allowed & (kp <= qpos)
    if window:
        allowed = allowed & (kp > qpos - window)
    sc = sc.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        sc = sc + mask
    if pad:
        sc = torch.nn.functional.pad(sc, (0, pad), value=float("-inf"))
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
    sc = sc.unflatten(-1, (T, tkv))                                             # [.., rows, T, tkv]
    m = torch.cummax(sc.amax(dim=-1), dim=-1).values                            # [.., rows, T]
    m_prev = torch.cat([torch.full_like(m[..., :1], float("-inf")), m[..., :-1]], dim=-1)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = numerics.operand(torch.exp(sc - safe.unsqueeze(-1)))
    alpha = torch.where(torch.isinf(m_prev), torch.zeros_like(m_prev), torch.exp(m_prev - safe))
    lt = p.double().sum(dim=-1).float()                                         # [.., rows, T]
    pv = numerics.tile_dot(p.movedim(-2, -3), v.unflatten(-2, (T, tkv)))       # [.., T, rows, D]
    o = torch.zeros(B, hkv, rows, d)
    l = torch.zeros(B, hkv, rows)                                     # noqa: E741
    for t in range(T):
        a = alpha[..., t]
        l = l * a + lt[..., t]                                        # noqa: E741
        o = o * a.unsqueeze(-1) + pv[..., t, :, :]
    return flash_finish(o, l).reshape(B, hq, lq, d)


# --- the fused attention design -----------------------------------------------------------------
Q_TILES = (64, 32, 16, 8, 4, 2, 1)       # query rows per head in one core's work item
KV_TILES = (256, 128, 64, 32, 16)        # keys per pass over the K/V stream
# wide heads only (Gemma 4's 512-dim full-attention heads: a 16-key K+V tile pair is 32 KB):
# when no KV_TILES tile fits, 8-key tiles, single-buffered if double buffers do not fit either
WIDE_HEAD_KV_TILE = 8
# online softmax per score, core cycles (hw/vector_costs.py ATTENTION_SOFTMAX, derived from
# mlir-aie softmax.cc): scale, running max, sub, convert, exp2 (+ stall), sum, bf16 P
SOFTMAX_CYCLES = ATTENTION_SOFTMAX.value.instr / BF16_LANES
SOFTMAX_PASSES = 6                       # element-ops per score (Plan.vector_elems statistics only)
KV_L1_SHARE = 0.6                        # L1 share the double-buffered K/V tiles may take


# --- flash (online-softmax) numerics ------------------------------------------------------------
def kv_tile_for(head_dim: int, l1_bytes: int | None = None) -> int:
    """Keys per K/V tile of the flash kernel: the largest tile in KV_TILES whose double-buffered
    K and V tiles (bf16) take at most KV_L1_SHARE of one core's L1, so query rows, scores and
    the fp32 accumulator fit next to them. Part of a design's identity: the online softmax
    rounds P against the running max, so the tile size defines the result (bf16 P)."""
    from torch_xdna.hw import AIE2P
    budget = (l1_bytes or AIE2P.l1_usable) * KV_L1_SHARE
    for t in KV_TILES + (WIDE_HEAD_KV_TILE,):
        if 2 * 2 * t * head_dim * 2 <= budget:
            return t
    return WIDE_HEAD_KV_TILE


def decode_splits(kv_heads: int, q_tiles: int, cores: int | None = None) -> int:
    """Split-KV factor of a launch: with few work items (decode: one query row per head), the
    keys of each KV head are split over cores (contiguous tile ranges, one partial softmax each,
    then one reduction) so the whole array streams the cache. 1 when the items fill the cores."""
    from torch_xdna.hw import AIE2P
    n = (cores or AIE2P.cores) // max(1, kv_heads * q_tiles)
    s = 1
    while s * 2 <= n:
        s *= 2
    return s


def split_ranges(n_tiles: int, splits: int) -> list[tuple[int, int]]:
    """Contiguous tile ranges [lo, hi) of the splits of a KV stream of `n_tiles` tiles."""
    per = ceil_div(max(n_tiles, 1), max(1, splits))
    return [(lo, min(lo + per, n_tiles)) for lo in range(0, n_tiles, per)]


def _flash_mask(rows_pos: torch.Tensor, k0: int, n: int, causal: bool, window: int | None,
                kv_valid: int) -> torch.Tensor | None:
    """Boolean 'hidden' mask [rows, n] of keys k0..k0+n-1 for query rows at rows_pos."""
    kpos = torch.arange(k0, k0 + n).unsqueeze(0)
    qp = rows_pos.unsqueeze(1)
    hidden = kpos >= kv_valid
    if causal:
        hidden = hidden | (kpos > qp)
    if window:
        hidden = hidden | (kpos <= qp - window)
    return hidden if bool(hidden.any()) else None


def _mask_scores(s: torch.Tensor, qpos: torch.Tensor, k0: int, lo: int, hi: int, causal: bool,
                 window: int | None, q_limit: torch.Tensor | None = None) -> None:
    """Mask in place the scores s [..., R, T] of padded keys (index j at absolute position
    k0 + j; valid keys are lo..hi-1): padding, future keys (causal: past each row's q_limit,
    default its position), keys older than the window. Only the column ranges where some row
    hides a key are touched."""
    ninf = float("-inf")
    if lo > 0:                                          # (an empty fill is still an op)
        s[..., :lo] = ninf
    if hi < s.shape[-1]:
        s[..., hi:] = ninf
    if causal:
        lim = qpos if q_limit is None else q_limit
        a = max(lo, int(lim.min()) + 1 - k0)           # first key some row must not see
        if a < hi:
            m = _flash_mask(lim, k0 + a, hi - a, True, None, k0 + hi)
            if m is not None:
                s[..., a:hi].masked_fill_(m, ninf)
    if window:
        b = min(hi, int(qpos.max()) - window + 1 - k0)  # keys before b are too old for some row
        if b > lo:
            m = _flash_mask(qpos, k0 + lo, b - lo, False, window, k0 + hi)
            if m is not None:
                s[..., lo:b].masked_fill_(m, ninf)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                    tkv: int, splits: int = 1, causal: bool = True, q_offset: int = 0,
                    k_offset: int = 0, window: int | None = None, softcap: float | None = None,
                    exact: bool = False, valid: int | None = None, q_rounded: bool = False,
                    operand=None, sinks: torch.Tensor | None = None,
                    q_limit: torch.Tensor | None = None) -> torch.Tensor:
    """The flash kernel's result: q [Hkv, R, D] (the R query rows of each KV head's group, at
    absolute position q_offset, or per row when q_offset is an [R] tensor),
    k / v [Hkv, S, D] holding keys at absolute positions k_offset..k_offset+S-1 -> fp32 [Hkv, R, D].

    Tile order defines the numerics: keys stream in tiles of `tkv` aligned to absolute multiples
    of tkv; per tile S = scale q k^T (fp32), m' = max(m, rowmax S), P = bf16(exp(S - m')),
    l = l e^(m-m') + sum exp(S - m'), O = O e^(m-m') + P V (fp32). With splits > 1 (split-KV
    decode) each contiguous range of tiles (split_ranges) runs that recurrence from scratch and a
    final reduction rescales the partial (m, l, O) to the common max. The recurrence is evaluated
    in closed form (each tile's partial scaled once by e^(m_tile - m_final), m_tile the running
    max after that tile): the same values as the loop up to fp32 summation order
    (flash_attention_loop is the literal loop; tests check they agree). exact=True: no bf16
    rounding (fp32 verification mode).
    valid: k / v already are the fp32, zero-padded tiles (k_offset a multiple of tkv, k.shape[1]
    == round_up(valid, tkv), keys past `valid` zero) holding `valid` keys: sim speed, the
    attention block's fp32 KV mirror (the same values the conversion and padding below make).
    q_rounded: q already is an operand (rounding is idempotent: not redone). operand: a
    function bit-equal to numerics.operand to round with (host_gemv.operand; sim speed).
    sinks: [Hkv, R] fp32, gpt-oss's learned logit per row in the softmax denominator: every
    split's running max starts at the sink, the reduction adds exp(sink - m_final) once.
    q_limit: [R] the last key each row may see under the causal mask (default its position;
    Gemma 3's image tokens see their whole image); the window counts back from the position."""
    rnd = (lambda t: t.float()) if exact else (operand or numerics.operand)
    hkv, r, d = q.shape
    s_len = k.shape[1] if valid is None else valid
    qpos = q_offset if isinstance(q_offset, torch.Tensor) else torch.full((r,), q_offset)
    # zero-pad K/V so tiles sit at absolute multiples of tkv (padded keys are masked)
    lead = k_offset % tkv
    total = round_up(lead + s_len, tkv)
    n_tiles = total // tkv
    if valid is not None:
        if lead or k.shape[1] != total or k.dtype != torch.float32 or v.shape != k.shape:
            raise ValueError(f"flash_attention: valid={valid} needs fp32 K/V of {total} keys at "
                             f"a tile-aligned k_offset, got {tuple(k.shape)} {k.dtype} at "
                             f"k_offset {k_offset}")
        kf, vf = k, v
    else:
        kf, vf = k.float(), v.float()
    if valid is None and total != s_len:
        kf = torch.nn.functional.pad(kf, (0, 0, lead, total - lead - s_len))
        vf = torch.nn.functional.pad(vf, (0, 0, lead, total - lead - s_len))
    s = torch.matmul(q if q_rounded and not exact else rnd(q),
                     kf.transpose(-1, -2)).mul_(scale)                  # [Hkv, R, T*tkv]
    if softcap is not None:
        s = torch.tanh(s.div_(softcap)).mul_(softcap)
    _mask_scores(s, qpos, k_offset - lead, lead, lead + s_len, causal, window, q_limit)
    st = s.view(hkv, r, n_tiles, tkv)
    tile_max = st.amax(-1)                                             # [Hkv, R, T]
    # running max within each split (split_ranges: segments of `per` tiles, the last shorter):
    # one cummax over the segments laid side by side, the tail padded with -inf (a prefix max
    # never sees what follows it), instead of one cummax per split (sim speed, the same values)
    per = ceil_div(max(n_tiles, 1), max(1, splits))
    if per == 1:
        run = tile_max
    else:
        segs = ceil_div(n_tiles, per)
        tm = tile_max if segs * per == n_tiles else torch.nn.functional.pad(
            tile_max, (0, segs * per - n_tiles), value=float("-inf"))
        run = torch.cummax(tm.unflatten(-1, (segs, per)), dim=-1).values.flatten(-2)
        if segs * per != n_tiles:
            run = run[..., :n_tiles]
    if sinks is not None:
        run = torch.maximum(run, sinks.unsqueeze(-1))
    ninf = float("-inf")
    dead = run == ninf                                                 # no visible key yet
    e = torch.exp(st - run.masked_fill(dead, 0.0).unsqueeze(-1))       # exp(S - m') per tile
    p = rnd(e)
    final = run.amax(-1, keepdim=True)
    w = torch.exp(run - final).masked_fill_(dead, 0.0)                # to the final max
    l = (e.sum(-1) * w).sum(-1)                                        # [Hkv, R]
    if sinks is not None:
        l = l + torch.exp(sinks - final.squeeze(-1))
    pv = torch.einsum("hrtk,htkd->hrtd", p, vf.view(hkv, n_tiles, tkv, d))
    o = torch.einsum("hrtd,hrt->hrd", pv, w)
    return o * torch.where(l > 0, 1.0 / l, torch.zeros_like(l)).unsqueeze(-1)


def flash_attention_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                         tkv: int, splits: int = 1, causal: bool = True, q_offset: int = 0,
                         k_offset: int = 0, window: int | None = None,
                         softcap: float | None = None, exact: bool = False,
                         sinks: torch.Tensor | None = None) -> torch.Tensor:
    """flash_attention as the kernel runs it: tile by tile, running (m, l, O) per split (m
    starting at the sink when there are sinks), then the split reduction. Slow; the definition
    tests check the closed form against."""
    rnd = (lambda t: t.float()) if exact else numerics.operand
    hkv, r, d = q.shape
    s_len = k.shape[1]
    qpos = q_offset if isinstance(q_offset, torch.Tensor) else torch.full((r,), q_offset)
    lead = k_offset % tkv
    n_tiles = ceil_div(lead + s_len, tkv)
    qf = rnd(q)
    ninf = float("-inf")
    parts = []
    for lo, hi in split_ranges(n_tiles, splits):
        m = torch.full((hkv, r), ninf) if sinks is None else sinks.float().clone()
        l = torch.zeros(hkv, r)
        o = torch.zeros(hkv, r, d)
        for t in range(lo, hi):
            a = max(0, t * tkv - lead)                    # slice of k covered by this tile
            b = min(s_len, (t + 1) * tkv - lead)
            if b <= a:
                continue
            s = torch.matmul(qf, k[:, a:b].float().transpose(-1, -2)) * scale
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            hidden = _flash_mask(qpos, k_offset + a, b - a, causal, window, k_offset + s_len)
            if hidden is not None:
                s = s.masked_fill(hidden, ninf)
            m_new = torch.maximum(m, s.amax(-1))
            live = m_new != ninf
            alpha = torch.where(live, torch.exp(m - m_new), torch.ones_like(m))
            e = torch.where(live.unsqueeze(-1), torch.exp(s - m_new.unsqueeze(-1)),
                            torch.zeros_like(s))
            l = l * alpha + e.sum(-1)
            o = o * alpha.unsqueeze(-1) + torch.matmul(rnd(e), v[:, a:b].float())
            m = torch.where(live, m_new, m)
        parts.append((m, l, o))
    mf = torch.stack([p[0] for p in parts]).amax(0)
    l_tot = torch.zeros(hkv, r)
    o_tot = torch.zeros(hkv, r, d)
    for m, l, o in parts:
        w = torch.where(m == ninf, torch.zeros_like(m), torch.exp(m - mf))
        l_tot = l_tot + l * w
        o_tot = o_tot + o * w.unsqueeze(-1)
    if sinks is not None:
        l_tot = l_tot + torch.exp(sinks - mf)
    return o_tot * torch.where(l_tot > 0, 1.0 / l_tot, torch.zeros_like(l_tot)).unsqueeze(-1)


# --- the fused attention design -----------------------------------------------------------------
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
    kv_tile: int = 0                # keys per K/V tile (0: the plan picks the fastest that fits)
    splits: int = 0                 # split-KV factor (0: decode_splits for the array's cores)
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
        # the plan's key tile fixes the order of the online softmax (runtime/sim/order.py)
        tkv = self.launch_plan(order.generation()).tile[1]     # memoized capacity plan
        out = design_order_attention(q, k[..., :n, :], v[..., :n, :], tkv, scale=self.softmax_scale,
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
        # double-buffered K/V tiles; single-buffered only when nothing else fits (wide heads)
        for buffers in (2, 1):
            if best is not None:           # single buffers only when no double-buffered tile fits
                break
            for tq in Q_TILES:
                if tq > self.q_len and tq > 1:
                    continue
                for tkv in ((self.kv_tile,) if self.kv_tile else KV_TILES):
                    if tkv > round_up(self.kv_len, KV_TILES[-1]) and tkv > KV_TILES[-1] \
                            and not self.kv_tile:
                        continue
                    l1 = self._l1(tq, tkv, rm, rk, buffers)
                    if l1 > gen.l1_usable:
                        continue
                    cand = self._evaluate(gen, tq, tkv, l1, self.kv_len, rm, rk, buffers)
                    if best is None or cand[0] < best[0]:
                        best = cand
        if best is None:
            need(label, "L1 data memory per core (query rows of a head group + K/V tiles)",
                 self._l1(1, self.kv_tile or KV_TILES[-1], rm, rk), gen.l1_usable,
                 "use a smaller head_dim or fewer query heads per KV head")
        plan = best[1]
        if kv_len is not None and kv_len != self.kv_len:
            if not 0 < kv_len <= self.kv_len:
                raise ValueError(f"attention: kv_len={kv_len} outside 1..{self.kv_len}")
            tq, tkv, _ = plan.tile
            plan = self._evaluate(gen, tq, tkv, plan.l1_bytes, kv_len, rm, rk,
                                  2 if plan.double_buffered else 1)[1]
        return check_plan(gen, label, plan)

    def _l1(self, tq: int, tkv: int, rm: int, rk: int, buffers: int = 2) -> int:
        rows = round_up(self.group * tq, rm)
        d = round_up(self.head_dim, rk)
        l1 = (rows * d * 2                      # Q rows (bf16)
              + 2 * buffers * tkv * d * 2       # K and V tiles, double-buffered (bf16)
              + rows * tkv * (4 + 2)            # scores (fp32) and P (bf16)
              + rows * d * 4                    # output accumulator (fp32)
              + rows * 2 * 4)                   # running max and sum
        if self.mask:
            l1 += 2 * rows * tkv * 4
        return l1

    def _evaluate(self, gen: Generation, tq: int, tkv: int, l1: int, kv_valid: int, rm: int,
                  rk: int, buffers: int = 2):
        b, hq, hkv, lq, d = self.batch, self.heads, self.kv_heads, self.q_len, self.head_dim
        q_tiles = ceil_div(lq, tq)
        n_tiles = ceil_div(kv_valid, tkv)
        splits = max(1, min(self.splits or decode_splits(b * hkv, q_tiles, gen.cores), n_tiles))
        items = b * hkv * q_tiles * splits
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
        per_item = visit / q_tiles / splits          # keys one work item streams
        macs_item = 2 * rows * dp * per_item
        rate = gen.macs_per_core_cycle.value["bf16"] * compute_efficiency(gen, "bf16")
        vec = SOFTMAX_CYCLES * rows * per_item
        # per KV tile: 2 kernel calls and the cost model's tile pass (accumulator rescale + fixed
        # pass cost, cost-v3)
        calls = per_item / tkv * (2 * gen.kernel_call_cycles.value
                                  + kv_tile_pass_cycles(gen, rows, dp, lanes(gen, 32)))
        cycles = ceil_div(items, cores) * (macs_item / rate + vec + calls)
        # split-KV: each split's (m, l, O) partial goes through the mem tile, one core per
        # (head, q tile) rescales and sums them (3 vector passes over O per split)
        partial_bytes = 0
        if splits > 1:
            partial_bytes = b * hkv * q_tiles * splits * rows * (dp + 2) * 4
            cycles += ceil_div(b * hkv * q_tiles, cores) * (
                3 * rows * dp * splits / lanes(gen, 32) + gen.kernel_call_cycles.value)
        # K/V stream: once per work item, shared by the cores of a column on the same KV head
        share = max(1, min(gen.core_rows.value, q_tiles))
        kv_bytes = b * hkv * visit * d * 2 * 2 / share
        q_bytes = b * hq * lq * d * self.in_dtype.itemsize
        mask_bytes = self._mask_elems(kv_valid) * (1 if self.mask_bool else 4) if self.mask else 0
        read = q_bytes + kv_bytes + mask_bytes
        write = b * hq * lq * d * self.out_dtype.itemsize
        t_dram = dram_time_s(gen, cols, read, write, kv_bytes)     # K/V: single-pass stream
        if buffers == 1:            # single-buffered K/V: each tile's DMA waits for the kernel
            cycles += t_dram * gen.core_clock_hz.value
        t_comp = cycles / gen.core_clock_hz.value
        fill = dram_time_s(gen, cols, 2 * tkv * d * 2 * cols, 0) + t_comp / max(1, items / cores) \
            / max(1, per_item / tkv)
        depth = gen.shim_task_queue_depth.value
        tasks = b * hkv * splits                    # one task per K/V stream (head, split)
        plan = Plan(
            design="attention", dtype="bf16", columns=cols, cores=cores, tile=(tq, tkv, d),
            l1_bytes=l1, memtile_bytes=2 * 2 * tkv * d * 2 + 2 * rows * d * 2 * gen.core_rows.value,
            core_bds=2 * 4 + (2 if self.mask else 0), memtile_bds=2 * (4 + gen.core_rows.value),
            core_locks=2 * 4 + (2 if self.mask else 0), shim_tasks=min(depth, tasks),
            double_buffered=buffers == 2, dram_read_bytes=int(read), dram_write_bytes=int(write),
            macs=2 * b * hq * lq * kv_valid * d, padded_macs=int(macs_item * items),
            vector_elems=int(SOFTMAX_PASSES * b * hq * lq * visit / q_tiles),
            compute_cycles=cycles,
            dma_shapes=(DmaTransfer("Q tile", (self.group, tq, d), (lq * d, d, 1)),
                        DmaTransfer("K/V stream", (ceil_div(kv_valid, tkv), tkv, d), (tkv * d, d, 1)),
                        DmaTransfer("O tile", (self.group, tq, d), (lq * d, d, 1))),
            notes={"work_items": items, "kv_visited_per_q_tile": visit / q_tiles,
                   "stream_bytes": int(kv_bytes),
                   "kv_share": share, "kv_splits": splits, "kv_tiles": n_tiles,
                   "onchip_bytes": partial_bytes, "fill_s": fill, "shim_task_batches": ceil_div(tasks, depth),
                   "memtile_locks": 2 * (4 + gen.core_rows.value),
                   "core_dma": (2, 1), "memtile_dma": (3, 2), "shim_dma": (2, 1)})
        return max(t_dram, t_comp) + fill, plan
