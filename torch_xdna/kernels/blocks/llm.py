"""Fused decoder-LLM blocks: the few designs a token runs through (1 launch per layer by default).

  EmbedDesign           ids -> rows of the (possibly quantized) embedding table, times a scale
  PosEmbedDesign        the same plus learned absolute positions (OPT)
  AttentionBlockDesign  input norm + QKV + optional QK-norm + RoPE + KV-cache write + attention over
                        the cache + o_proj (+ Gemma post-norm) + residual
  MlpBlockDesign        norm + gate/up + act*mul + down (+ Gemma post-norm) + residual
  HeadDesign            final norm + lm_head (+ logit soft-capping) for one row
  DecoderLayerDesign    attention block + MLP block as one launch (the default "layer" layout;
                        the "block" layout launches the two blocks separately)

Family differences are fields: RMSNorm or LayerNorm + bias, projection biases, RoPE (whole or
partial) or learned positions, a gated or plain MLP, an attention output gate (Qwen3.5). The
mixture-of-experts and linear-attention blocks are in blocks/moe.py and blocks/linear_attn.py.

Numerics (reference): the NPU's policy of kernels/numerics.py, i.e. bf16 operands and fp32
accumulation; quantized weights are dequantized on the core to bf16 (`dequantize`). Precision
"fp32" is a verification mode only (operands not rounded): it is not what the NPU computes.

Plans: built from the component GEMM/vector plans (compute cycles, tiles, capacity checks); DRAM
traffic is what a fused block streams: every weight byte once per launch, the KV cache it reads
and writes, its activations in and out (intermediates stay on chip). Per-token values (position,
valid rows) are launch scalars, so one design, one Program and one hardware context serve every
token. The attention block's `launch_plan` charges a launch at its KV extent, rounded up to
KV_TILE (the unit its kernel streams the cache in), memoized per extent; `plan` is the plan at a
full cache, used for the capacity checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES  # noqa: F401  (KV_DTYPES: named from here by callers)
from torch_xdna.hw import Generation
from torch_xdna.hw.vector_costs import dequant_cycles
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design, ceil_div, round_up
from torch_xdna.kernels.stages import llm_head as head_stages
from torch_xdna.kernels.stages import llm_layer as llm_stages
from torch_xdna.kernels.blocks.operands import KV_MIRROR
from torch_xdna.kernels.blocks.toolkit import (
    KV_TILE, attend, combine_plans, fused_plan, gemm_plan, inference_mode, kv_bucket, kv_launch_plan,
    layer_norm, matmul, operand_rounding, prologue, qk_norm_weight, resident_operand, rms_norm, rope,
    signed_sin, take_linear, vector_plan,
)
from torch_xdna.kernels.blocks.weights import (  # noqa: F401  (PRECISIONS: named from here by callers)
    PRECISIONS, dequantize, weight_bytes, weight_tensors,
)
from torch_xdna.kernels.host import gemv as host_gemv
from torch_xdna.kernels.ops.attention import AttentionDesign, decode_splits, kv_tile_for
from torch_xdna.runtime.plan import Plan

KV_INT8_QMAX = 127.0
# the stage programs of the blocks whose stages are structural (kernels/lower/fused.py builds
# them in this order; tests/test_launch_abi.py checks the counts against the lowering)
ATTENTION_STAGES = ("attn_norm", "qkv_proj", "rope", "attention", "o_proj")
MLP_STAGES = ("mlp_norm", "gate_up", "act", "mul", "down")
HEAD_STAGES = ("final_norm", "lm_head")


def quantize_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 KV rows: x [..., D] -> (int8 values, fp32 scale [...]) with one symmetric scale per
    (head, token) row, amax / KV_INT8_QMAX (a zero row gets scale 0 and values 0)."""
    amax = x.abs().amax(-1)
    scale = amax / KV_INT8_QMAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    qv = torch.round(x / safe.unsqueeze(-1)).clamp_(-KV_INT8_QMAX, KV_INT8_QMAX)
    return qv.to(torch.int8), scale


def dequantize_kv(qv: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 K/V rows from int8 values and their per-row scales (the core's dequant before
    the bf16 mmul; the caller rounds to operands)."""
    return qv.float() * scale.unsqueeze(-1)



def span_limits(spans: tuple, pos: int, n: int) -> torch.Tensor | None:
    """The last key each of rows pos..pos+n-1 may see when `spans` ((start, end) ranges inside
    the chunk) attend bidirectionally: end - 1 inside a span, the row's own position elsewhere;
    None when no span touches the chunk (plain causal)."""
    hit = [(a, b) for a, b in spans if a < pos + n and b > pos]
    if not hit:
        return None
    lim = torch.arange(pos, pos + n)
    for a, b in hit:
        if a < pos or b > pos + n:
            raise ValueError(f"a bidirectional span {a}..{b} crosses the chunk {pos}..{pos + n}")
        lim[a - pos:b - pos] = b - 1
    return lim


# -- designs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmbedDesign(Design):
    """x[:n] = table[ids[:n]] * scale. inputs: *table (precision format), ids int32 [rows].
    Its plan is DMA traffic only: `tables_per_row` gathered table rows per token (a subclass
    adding learned positions gathers two)."""

    vocab: int
    hidden: int
    rows: int
    precision: str
    group: int
    scale: float = 1.0
    kind = "llm_embed"
    family = "llm"                     # the name's prefix
    tables_per_row = 1

    @property
    def name(self) -> str:
        return f"{self.family}.embed[{self.precision}]"

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n = self.rows if n is None else n
        nt = weight_tensors(self.precision)
        ids = inputs[nt][:n].long()
        rows = dequantize([t[ids] for t in inputs[:nt]], self.precision, self.group)
        if self.scale != 1.0:
            rnd = operand_rounding(self.precision == "fp32")
            rows = rnd(rows) * rnd(torch.tensor(self.scale))
        outputs[0][:n].copy_(rows)

    def plan(self, gen: Generation) -> Plan:
        row = weight_bytes(1, self.hidden, self.precision, self.group) * self.tables_per_row
        read = self.rows * (row + 4)
        write = self.rows * self.hidden * 4
        return Plan(design=self.kind, dtype="dma", columns=1, cores=0, tile=(self.hidden,),
                    memtile_bytes=min(gen.memtile_bytes.value, 2 * row), memtile_bds=2,
                    double_buffered=True, dram_read_bytes=read, dram_write_bytes=write)


@dataclass(frozen=True)
class PosEmbedDesign(EmbedDesign):
    """x[:n] = table[ids[:n]] + positions[pos + offset ...] (learned absolute positions, OPT).
    inputs: *table, ids int32 [rows], positions [P, H] (bf16; fp32 in verification mode).
    scalars: pos (first position; batched decode: one position per row, a tuple)."""

    offset: int = 0
    tables_per_row = 2

    @property
    def name(self) -> str:
        return f"{self.family}.pos_embed[{self.precision}]"

    @inference_mode
    def reference(self, inputs, outputs, pos=0, n: int | None = None, **_: Any) -> None:
        n = self.rows if n is None else n
        nt = weight_tensors(self.precision)
        ids = inputs[nt][:n].long()
        rows = dequantize([t[ids] for t in inputs[:nt]], self.precision, self.group)
        at = (torch.tensor(pos[:n]) if isinstance(pos, tuple) else torch.arange(pos, pos + n))
        table = resident_operand(inputs[nt + 1], self.precision == "fp32")
        outputs[0][:n].copy_(rows + table[at + self.offset])


@dataclass(frozen=True)
class DecoderBlockDesign(Design):
    """What the decoder blocks share: rows of width `hidden` in, an RMSNorm (eps, weight
    offset) first, weights stored in `precision` (scale groups of `group`). Named
    llm.<label>[precision]."""

    hidden: int
    rows: int
    precision: str
    group: int
    eps: float
    norm_offset: float
    label = "block"
    layer_norm = False      # LayerNorm + bias instead of RMSNorm (a field where a block has it)
    bias = False            # biases on the projections

    @property
    def name(self) -> str:
        return f"llm.{self.label}[{self.precision}]"

    def norm_bias(self, inputs, exact: bool) -> tuple[torch.Tensor | None, int]:
        """The input norm's bias (LayerNorm blocks) and the index of the next input."""
        return (resident_operand(inputs[2], exact), 3) if self.layer_norm else (None, 2)

    def normalize(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rnd) -> torch.Tensor:
        """The block's input norm: RMSNorm, or LayerNorm with its bias."""
        if self.layer_norm:
            return layer_norm(x, w, b, self.eps, rnd)
        return rms_norm(x, w, self.eps, self.norm_offset, rnd)


@dataclass(frozen=True)
class AttentionBlockDesign(DecoderBlockDesign):
    """out[:n] = x + [post_norm](o_proj(attn(rope(qk_norm(qkv(norm(x))))))), writing K/V rows
    pos..pos+n-1 into the cache first.

    inputs: x [rows,H] fp32, attn_norm [H], (q_norm [D], k_norm [D])?, *w_qkv [(Hq+2Hkv)D, H],
            *w_o [H, Hq*D], (sinks [Hq])?, (post_norm [H])?, cos [P,D], sin [P,D]
    outputs: out [rows,H] fp32 (may alias x), k_cache [Hkv,S,D], v_cache [Hkv,S,D]
             (kv_dtype int8: int8 caches, then k_scale [Hkv,S], v_scale [Hkv,S] fp32)
    scalars: pos (first position), n (valid rows, default rows), spans ((start, end) absolute
             position ranges inside this chunk whose rows see each other bidirectionally:
             Gemma 3's image tokens; default none, causal)
    Attention is the flash kernel (attend): K/V tiles of `tkv` keys, online softmax, split-KV
    over the array's cores for decode rows; no score row is ever whole in one core's L1, so any
    context up to the cache capacity plans.
    """

    heads: int
    kv_heads: int
    head_dim: int
    capacity: int               # KV cache positions (the tiling is chosen for a full cache)
    qk_norm: bool = False
    post_norm: bool = False
    window: int | None = None
    scale: float = 1.0
    softcap: float | None = None
    cache_bytes: int = 2        # per cached element (bf16; 4 in the fp32 verification mode)
    kv_dtype: str = DEFAULT_KV_DTYPE   # bf16 (fp32 in verification mode) or int8 + scales
    kv_tile: int = 0            # keys per K/V tile (0: kv_tile_for(head_dim))
    layer_norm: bool = False
    bias: bool = False          # q/k/v bias [(Hq+2Hkv)D] after w_qkv, o bias [H] after w_o
    rope: bool = True           # False: positions come from the embedding (no cos/sin inputs)
    output_gate: bool = False   # w_qkv also holds a gate [Hq*D] after v: o_proj(attn * sigmoid(gate))
    rotary_dim: int = 0         # partial RoPE over each head's first rotary_dim dims (0: all)
    v_norm: bool = False        # values RMS-normalized without a weight (Gemma 4)
    kv_shared: bool = False     # attends over another layer's cache: w_qkv holds q only, only
    #                             the q norm is an input, and nothing is written (Gemma 4)
    sinks: bool = False         # a learned logit per q head in every softmax denominator
    #                             (gpt-oss), an input [Hq] after w_o (and its bias)
    kind = "llm_attention"
    label = "attention"

    def __post_init__(self):
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"unknown kv_dtype {self.kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")

    @property
    def tkv(self) -> int:
        return self.kv_tile or kv_tile_for(self.head_dim)

    @property
    def splits(self) -> int:
        """Split-KV factor: decode rows spread each KV head's cache over the cores."""
        return decode_splits(self.kv_heads, 1) if self.rows == 1 else 1

    @property
    def kv_elem_bytes(self) -> float:
        """Bytes per cached K or V element, scales included."""
        return 1 + 4 / self.head_dim if self.kv_dtype == "int8" else self.cache_bytes

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None,
                  spans: tuple = (), **_: Any) -> None:
        n, exact, rnd, x, ln = prologue(self, inputs, n)
        nt = weight_tensors(self.precision)
        hq, hkv, d = self.heads, self.kv_heads, self.head_dim
        lnb, i = self.norm_bias(inputs, exact)
        nk = 0 if self.kv_shared else hkv          # k/v heads this layer projects
        if self.qk_norm and self.kv_shared:
            qk_w, i = resident_operand(inputs[i], exact), i + 1
        elif self.qk_norm:
            qk_w = qk_norm_weight(inputs[i], inputs[i + 1], hq, hkv, exact)
            i += 2
        wqkv, bqkv, i = take_linear(inputs, i, nt, self.bias, exact)
        wo, bo, i = take_linear(inputs, i, nt, self.bias, exact)
        sinks = None
        if self.sinks:
            sinks, i = resident_operand(inputs[i], exact), i + 1
        if self.post_norm:
            pn = resident_operand(inputs[i], exact)
            i += 1
        out, kc, vc = outputs[:3]
        xs = x if n == x.shape[0] else x[:n]
        h = self.normalize(xs, ln, lnb, rnd)
        # every use of q, k and v takes them as operands: round the projection once
        qkv = matmul(h, wqkv, self.precision, self.group, rnd)
        qkv = rnd(qkv.add_(bqkv) if self.bias else qkv).view(n, -1, d)
        qk, v = qkv.narrow(1, 0, hq + nk), qkv.narrow(1, hq + nk, nk)
        if self.qk_norm:               # q and k heads normalized together (per-head weights)
            qk = rms_norm(qk, qk_w, self.eps, self.norm_offset, rnd, rounded=True, round_out=True)
        if self.v_norm:
            v = rnd(v * (v * v).mean(-1, keepdim=True).add_(self.eps).rsqrt_())
        if self.rope:
            cos_t, sin_t = resident_operand(inputs[i], exact), signed_sin(inputs[i + 1], exact)
            cos = cos_t[pos:pos + n].unsqueeze(1)
            sin = sin_t[pos:pos + n].unsqueeze(1)
            rd = self.rotary_dim or d
            if rd < d:                   # partial RoPE: the other dims pass through
                qk = torch.cat([rnd(rope(qk[..., :rd], cos, sin)), qk[..., rd:]], dim=-1)
            else:
                # the cache stores operand(k); attention takes operand(q)
                r = host_gemv.rope(qk, cos, sin) if rnd is host_gemv.operand else None
                qk = rnd(rope(qk, cos, sin)) if r is None else r
        k_new, v_new = qk.narrow(1, hq, nk).transpose(0, 1), v.transpose(0, 1)
        end = pos + n
        tkv = self.tkv
        # keys the first row can see, from the tile holding the oldest one (tiles are aligned)
        start = max(0, pos - self.window + 1) // tkv * tkv if self.window is not None else 0
        valid = None
        if self.kv_dtype == "int8":
            ks, vs = outputs[3], outputs[4]
            for cache, scales, rows in ((kc, ks, k_new), (vc, vs, v_new)):
                if self.kv_shared:
                    break
                qv, sc = quantize_kv(rows)
                cache.narrow(1, pos, n).copy_(qv)
                scales.narrow(1, pos, n).copy_(sc)
            keys = rnd(dequantize_kv(kc.narrow(1, start, end - start), ks.narrow(1, start, end - start)))
            vals = rnd(dequantize_kv(vc.narrow(1, start, end - start), vs.narrow(1, start, end - start)))
        else:
            kver, vver = kc._version, vc._version
            if not self.kv_shared:
                kc.narrow(1, pos, n).copy_(k_new)
                vc.narrow(1, pos, n).copy_(v_new)
            keys, vals = kc.narrow(1, start, end - start), vc.narrow(1, start, end - start)
            if kc.dtype == torch.bfloat16 and not self.kv_shared:   # fp32 tiles from the mirror
                km = KV_MIRROR.rows(kc, kver, pos, end, start, tkv)
                vm = KV_MIRROR.rows(vc, vver, pos, end, start, tkv) if km is not None else None
                if vm is not None:
                    keys, vals, valid = km, vm, end - start
        a = attend(qk.narrow(1, 0, hq).transpose(0, 1), keys, vals,
                   scale=self.scale, q_offset=pos, k_offset=start, window=self.window,
                   softcap=self.softcap, exact=exact, rounded=True, tkv=tkv, splits=self.splits,
                   valid=valid, host=rnd is host_gemv.operand, sinks=sinks,
                   q_limit=span_limits(spans, pos, n))
        a = a.transpose(0, 1).reshape(n, hq * d)
        if self.output_gate:
            a = a * torch.sigmoid(qkv.narrow(1, hq + 2 * hkv, hq).reshape(n, hq * d))
        o = matmul(a, wo, self.precision, self.group, rnd)
        if self.bias:
            o = o.add_(bo)
        if self.post_norm:
            o = rms_norm(o, pn, self.eps, self.norm_offset, rnd)
        (out if n == out.shape[0] else out[:n]).copy_(o.add_(xs))   # x + o (IEEE: commutes)

    def runs(self) -> tuple:
        return tuple((self.key, s) for s in ATTENTION_STAGES)

    def plan(self, gen: Generation) -> Plan:
        """The plan at a full cache (capacity checks; what an unscaled launch is charged)."""
        return self.plan_at(gen, kv_bucket(self.capacity, self.capacity))

    def launch_plan(self, gen: Generation, pos: int = 0, n: int | None = None, **_: Any) -> Plan:
        """The plan at this launch's KV extent (toolkit.kv_launch_plan)."""
        return kv_launch_plan(self, gen, pos, n)

    def plan_at(self, gen: Generation, kv_len: int, sequences: int = 1) -> Plan:
        """sequences > 1: the rows are that many independent decode sequences (batched decode,
        kernels/blocks/llm_batch.py), one query each over its own cache with the batch-1 split-KV
        factor, not `rows` causal queries of one sequence (which would run 1/`rows` of the work
        items with no split-KV and a visit of every key per query tile)."""
        name = f"{self.name} rows={self.rows} kv={kv_len}"
        m, h, d = self.rows, self.hidden, self.head_dim
        qkv_n = (self.heads * (2 if self.output_gate else 1)
                 + (0 if self.kv_shared else 2) * self.kv_heads) * d
        q = m // sequences
        keys = kv_len if self.window is None else min(kv_len, round_up(self.window + q, KV_TILE))
        splits = self.splits if sequences == 1 else decode_splits(self.kv_heads, q)
        # flash attention: its plan charges every KV tile pass (per-tile cost of the cost model)
        attn = AttentionDesign(sequences, self.heads, self.kv_heads, q, keys, d, causal=True,
                               window=self.window or 0, softcap=self.softcap or 0.0,
                               scale=self.scale, kv_tile=self.tkv, splits=splits).plan(gen)
        fixed = self.__dict__.setdefault("_fixed_stages", {})   # the KV-independent stages
        if gen.name not in fixed:
            fixed[gen.name] = (
                vector_plan(gen, "rms_norm", m, h),
                gemm_plan(gen, m, h, qkv_n, self.precision, group=self.group),
                vector_plan(gen, "mul", m, qkv_n, 2),
                gemm_plan(gen, m, self.heads * d, h, self.precision, group=self.group))
        norm, qkv, rope, o_proj = fixed[gen.name]
        stages = [norm, qkv, rope, attn, o_proj] if self.rope else [norm, qkv, attn, o_proj]
        w = (weight_bytes(qkv_n, h, self.precision, self.group)
             + weight_bytes(h, self.heads * d, self.precision, self.group))
        small = (h + ((2 - self.kv_shared) * d if self.qk_norm else 0) + (h if self.post_norm else 0)
                 + (h if self.layer_norm else 0) + (qkv_n + h if self.bias else 0)
                 + (self.heads if self.sinks else 0)) * 2
        small += 2 * m * d * 4 if self.rope else 0
        kv_read = int(2 * self.kv_heads * keys * d * self.kv_elem_bytes)
        kv_write = 0 if self.kv_shared else int(2 * self.kv_heads * m * d * self.kv_elem_bytes)
        read = w + small + kv_read + m * h * 4
        write = kv_write + m * h * 4
        return fused_plan(name, self.kind, self.precision, gen, stages, read, write, m,
                           max(h, self.heads * d),
                           {"weight_bytes": w, "kv_read_bytes": kv_read, "kv_write_bytes": kv_write,
                            "onchip_bytes": attn.notes.get("onchip_bytes", 0),
                            "kv_tile": self.tkv, "kv_splits": attn.notes.get("kv_splits", 1)},
                           extra_cycles=self._kv_dequant_cycles(gen, attn))

    def _kv_dequant_cycles(self, gen: Generation, attn: Plan) -> float:
        """Per-core cycles to dequantize an int8 KV cache to bf16 on the core before QK^T and
        P @ V (cost-v4, hw/vector_costs.py): every K and V element a work item streams."""
        if self.kv_dtype != "int8":
            return 0.0
        per_item = attn.notes["kv_visited_per_q_tile"] / attn.notes.get("kv_splits", 1)
        items = ceil_div(attn.notes["work_items"], max(1, attn.cores))
        return items * 2 * per_item * self.head_dim * dequant_cycles(
            8, gen.vector_load_bits.value, gen.vector_store_bits.value)


@dataclass(frozen=True)
class MlpBlockDesign(DecoderBlockDesign):
    """out[:n] = x + [post_norm](down(act(gate(norm(x))) * up(norm(x)))).

    inputs: x [rows,H] fp32, mlp_norm [H], *w_gate_up [2I, H], *w_down [H, I], (post_norm [H])?
    outputs: out [rows,H] fp32 (may alias x)
    """

    intermediate: int
    act: str = "silu"
    post_norm: bool = False
    layer_norm: bool = False
    bias: bool = False          # up (or gate_up) bias after w_gate_up, down bias after w_down
    gated: bool = True          # False: down(act(up(h))), w_gate_up holds up only [I, H]
    verify: bool = False        # fp32 verification numerics over exactly-decoding (mxfp4) weights
    kind = "llm_mlp"
    label = "mlp"

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n, exact, rnd, x, ln = prologue(self, inputs, n)
        nt = weight_tensors(self.precision)
        lnb, i = self.norm_bias(inputs, exact)
        wgu, bgu, i = take_linear(inputs, i, nt, self.bias, exact)
        wd, bd, i = take_linear(inputs, i, nt, self.bias, exact)
        xs = x if n == x.shape[0] else x[:n]
        h = self.normalize(xs, ln, lnb, rnd)
        gu = matmul(h, wgu, self.precision, self.group, rnd)
        gu = rnd(gu.add_(bgu) if self.bias else gu)
        f = self.intermediate
        if self.gated:
            a = apply_epilogue(self.act, gu.narrow(1, 0, f)) * gu.narrow(1, f, f)
        else:
            a = apply_epilogue(self.act, gu)
        y = matmul(a, wd, self.precision, self.group, rnd)
        if self.bias:
            y = y.add_(bd)
        if self.post_norm:
            y = rms_norm(y, resident_operand(inputs[i], exact), self.eps, self.norm_offset, rnd)
        out = outputs[0]
        (out if n == out.shape[0] else out[:n]).copy_(y.add_(xs))   # x + y (IEEE: commutes)

    def runs(self) -> tuple:
        return tuple((self.key, s) for s in MLP_STAGES)

    def plan(self, gen: Generation) -> Plan:
        name = f"{self.name} rows={self.rows}"
        m, h, f = self.rows, self.hidden, self.intermediate
        up = (2 if self.gated else 1) * f
        stages = [vector_plan(gen, "layer_norm" if self.layer_norm else "rms_norm", m, h),
                  gemm_plan(gen, m, h, up, self.precision, group=self.group),
                  vector_plan(gen, self.act, m, f)]
        stages += [vector_plan(gen, "mul", m, f, 2)] if self.gated else []
        stages += [gemm_plan(gen, m, f, h, self.precision, group=self.group)]
        w = (weight_bytes(up, h, self.precision, self.group)
             + weight_bytes(h, f, self.precision, self.group))
        small = h * (1 + self.post_norm + self.layer_norm) + (up + h if self.bias else 0)
        read = w + small * 2 + m * h * 4
        return fused_plan(name, self.kind, self.precision, gen, stages, read, m * h * 4, m,
                           max(h, f), {"weight_bytes": w})


@dataclass(frozen=True)
class HeadDesign(DecoderBlockDesign):
    """logits[0] = softcap(lm_head(norm(x[n-1]))) for the last valid row.

    inputs: x [rows,H] fp32, final_norm [H], *w_lm [V, H]; outputs: logits [1, V] fp32
    """

    vocab: int
    softcap: float | None = None
    layer_norm: bool = False    # final LayerNorm: its bias is the input after final_norm
    kind = "llm_head"
    label = "head"

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        if numerics.layer_order() == "plan" and head_stages.unsupported(self, n) is None:
            return head_stages.staged_reference(self, inputs, outputs, pos, n)  # txn-identical
        n, exact, rnd, x, ln = prologue(self, inputs, n)
        lnb, i = self.norm_bias(inputs, exact)
        w = inputs[i:i + weight_tensors(self.precision)]
        h = self.normalize(x[n - 1:n], ln, lnb, rnd)
        logits = matmul(h, w, self.precision, self.group, rnd)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        outputs[0].copy_(logits)

    def runs(self) -> tuple:
        return tuple((self.key, s) for s in HEAD_STAGES + (("softcap",) if self.softcap else ()))

    def plan(self, gen: Generation) -> Plan:
        return self.plan_rows(gen, 1, f"{self.name} vocab={self.vocab}", self.kind)

    def plan_rows(self, gen: Generation, m: int, name: str, kind: str) -> Plan:
        """The head over `m` rows, one logits row each (batched decode: m sequences)."""
        stages = [vector_plan(gen, "rms_norm", m, self.hidden),
                  gemm_plan(gen, m, self.hidden, self.vocab, self.precision, group=self.group)]
        if self.softcap:
            stages.append(vector_plan(gen, "tanh", m, self.vocab))
        w = weight_bytes(self.vocab, self.hidden, self.precision, self.group)
        read = w + self.hidden * 2 + m * self.hidden * 4
        return fused_plan(name, kind, self.precision, gen, stages, read, m * self.vocab * 4, m,
                          self.hidden, {"weight_bytes": w})


def rows_bucket(n: int, chunk: int) -> int:
    """Rows a prefill launch is planned for: the next power of two (at most `chunk`), so a few
    designs serve every prompt length."""
    r = 1
    while r < n:
        r *= 2
    return min(r, chunk) if n <= chunk else ceil_div(n, chunk) * chunk


@dataclass(frozen=True)
class DecoderLayerDesign(Design):
    """One launch per layer: the attention block then the MLP block back to back on the array
    (the default layout "layer"; layout "block" runs them as two launches). Same numerics as the
    two blocks; the plan is theirs combined (the residual row stays on chip between them).

    inputs: the attention block's inputs, then the MLP block's inputs without x
    outputs: out [rows,H] fp32, k_cache, v_cache
    """

    attention: AttentionBlockDesign
    mlp: MlpBlockDesign
    kind = "llm_layer"

    @property
    def name(self) -> str:
        """llm.layer / llm.moe_layer / llm.deltanet_layer [attention/mlp precision] (from kind)."""
        return f"llm.{self.kind.removeprefix('llm_')}[{self.attention.precision}/{self.mlp.precision}]"

    @property
    def n_attention_inputs(self) -> int:
        a = self.attention
        return (2 + a.layer_norm + ((2 - a.kv_shared) if a.qk_norm else 0) + 2 * weight_tensors(a.precision)
                + 2 * a.bias + a.sinks + (1 if a.post_norm else 0) + 2 * a.rope)

    def reference(self, inputs, outputs, **scalars: Any) -> None:
        # the stage programs' order (txn-identical); their attention is causal only
        if numerics.layer_order() == "plan" and not scalars.get("spans"):
            if llm_stages.unsupported(self, scalars.get("n")) is None:
                return llm_stages.staged_reference(self, inputs, outputs, **scalars)
        na = self.n_attention_inputs
        self.attention.reference(inputs[:na], outputs, **scalars)
        self.mlp.reference([outputs[0], *inputs[na:]], [outputs[0]], **scalars)

    def runs(self) -> tuple:
        """The 12 executable stage programs (stages/llm_layer.py), or the two blocks' structural
        stages when the layer is not lowered as executable stages."""
        r = self.__dict__.get("_runs")
        if r is None:
            if llm_stages.unsupported(self) is None:
                r = tuple((self.key, st.label) for st in llm_stages.stages(self))
            else:
                r = self.attention.runs() + self.mlp.runs()
            object.__setattr__(self, "_runs", r)
        return r

    def plan(self, gen: Generation) -> Plan:
        return self.combine(self.attention.plan(gen), self.mlp.plan(gen))

    def launch_plan(self, gen: Generation, **scalars: Any) -> Plan:
        a = self.attention.launch_plan(gen, **scalars)
        cache = self.__dict__.setdefault("_launch_plans", {})
        plan = cache.get(id(a))
        if plan is None:
            mlp = self.__dict__.setdefault("_mlp_plans", {})
            if gen.name not in mlp:
                mlp[gen.name] = self.mlp.plan(gen)
            plan = cache[id(a)] = self.combine(a, mlp[gen.name])
        return plan

    def combine(self, a: Plan, m: Plan) -> Plan:
        """The layer's plan from its attention plan `a` and MLP plan `m`: x is handed over on
        chip (neither written by the first nor read by the second)."""
        row = self.attention.rows * self.attention.hidden * 4
        return combine_plans(
            self.kind, (a, m), double_buffered=True, dma_shapes=(),
            dram_read_bytes=a.dram_read_bytes + m.dram_read_bytes - row,
            dram_write_bytes=a.dram_write_bytes + m.dram_write_bytes - row,
            notes={k: a.notes.get(k, 0) + m.notes.get(k, 0)
                   for k in ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "fill_s",
                             "onchip_bytes", "stream_bytes")})
