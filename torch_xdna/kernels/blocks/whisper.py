"""Fused Whisper blocks: the encoder as one Program, the decoder on the fused-decode rail.

  WhisperStemDesign          conv1 + GELU + conv2 (stride 2) + GELU + positional table
  WhisperEncoderLayerDesign  pre-LN self-attention + pre-LN GELU MLP (one launch per layer)
  WhisperCrossKVDesign       final encoder LayerNorm (first layer only), then one decoder layer's
                             cross-attention K/V over the encoder output, written to resident
                             buffers once per utterance (every decoding step reads them)
  WhisperEmbedDesign         token embedding * scale + learned position rows pos..pos+n
  WhisperDecoderLayerDesign  self-attention (KV cache resident, written at pos) + cross-attention
                             over the resident K/V + MLP, one launch per layer per token
  WhisperHeadDesign          final LayerNorm of the last row + the tied output projection

Numerics: precision "bf16" is the NPU's policy (kernels/numerics.py: bf16 operands, fp32
accumulation, caches bf16); "int8" is bf16 with the projection/MLP matrices (and the output
projection) stored as int8 with a bf16 scale per group along K, dequantized to bf16 operands on
the core (weight-only, like the decoder engine's int8; the conv stem, embeddings, norms and biases
stay bf16); "fp32" is the verification mode (nothing rounded, the same ops as transformers'
eager implementation) used to show token-identical decoding. The encoder (stem, layers, cross
K/V) and the decoder (layers, head) may take different precisions: `split_precision`.

Plans: the component GEMM/vector/conv plans. Decoder blocks stream every weight byte once per
launch plus the caches they read and write (llm_blocks' fused accounting); the encoder blocks
(1500 rows) spill their intermediates to DRAM (encoder_blocks' conservative accounting).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.blocks.encoder import layer_norm_design
from torch_xdna.kernels.blocks.llm import EmbedDesign
from torch_xdna.kernels.stages import whisper as whisper_stages
from torch_xdna.kernels.stages.llm_layer import cached_runs
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.blocks.toolkit import (
    KV_TILE, attend, combine_plans, fused_plan, gemm_plan, inference_mode, kv_bucket,
    kv_launch_plan, vector_plan,
)
from torch_xdna.kernels.blocks.weights import (
    GROUPED_PRECISIONS, WHISPER_PRECISIONS, default_group, mm_dtype, weight_bytes,
)
from torch_xdna.kernels.ops.conv import ConvDesign
from torch_xdna.runtime.plan import Plan, PlanError


WHISPER_GROUPS = ("encoder", "decoder")


def _check(precision: str) -> None:
    if precision not in WHISPER_PRECISIONS:
        raise ValueError(f"unknown Whisper precision {precision!r}; use one of "
                         f"{', '.join(WHISPER_PRECISIONS)} (fp32 is the verification mode)")


def split_precision(precision: "str | Mapping[str, str]") -> tuple[str, str]:
    """(encoder, decoder) precisions of 'int8' or {'encoder': 'int8', 'decoder': 'bf16'}; fp32
    (the verification mode) is not mixed with NPU precisions."""
    if isinstance(precision, str):
        pe = pd = precision
    else:
        unknown = set(precision) - set(WHISPER_GROUPS)
        if unknown or set(precision) != set(WHISPER_GROUPS):
            raise ValueError(f"Whisper precision groups {sorted(precision)}; give both of "
                             f"{', '.join(WHISPER_GROUPS)}")
        pe, pd = precision["encoder"], precision["decoder"]
    _check(pe)
    _check(pd)
    if (pe == "fp32") != (pd == "fp32"):
        raise ValueError("Whisper precision fp32 (verification mode) cannot be mixed with NPU "
                         "precisions")
    return pe, pd


def _float(precision: str) -> str:
    """The precision of float-only sites (conv stem, embeddings) under `precision`."""
    return "fp32" if precision == "fp32" else "bf16"


def _group(precision: str, k: int) -> int:
    """Group size of a grouped precision's matrix with reduction size k (the default, reduced
    to a divisor of k, as the engine quantizes it); 0 otherwise."""
    return math.gcd(default_group(precision), k) if precision in GROUPED_PRECISIONS else 0


def _mm(gen: Generation, m: int, k: int, n: int, precision: str) -> Plan:
    """The plan of a matmul by a resident [n, k] weight stored in `precision`."""
    return gemm_plan(gen, m, k, n, mm_dtype(precision), group=_group(precision, k))


def _wb(n: int, k: int, precision: str) -> int:
    return weight_bytes(n, k, precision, _group(precision, k))


def _grouped(inputs, matrices: tuple[int, ...], precision: str) -> list:
    """The flat launch inputs as the block's logical ones: with a grouped precision each
    matrix position (index into the logical list) is a (values, scales) pair."""
    if precision not in GROUPED_PRECISIONS:
        return list(inputs)
    out, it = [], iter(inputs)
    for t in it:
        out.append((t, next(it)) if len(out) in matrices else t)
    return out


class WhisperBlockDesign(Design):
    """What the Whisper blocks share: a precision of WHISPER_PRECISIONS (checked when built),
    named whisper.<label>[precision]. Subclasses are frozen dataclasses."""

    label = "block"
    precision: str

    def __post_init__(self):
        _check(self.precision)

    def runs(self) -> tuple:
        """One kernel run per stage program (stages/whisper.py), as the staged artifact runs."""
        return cached_runs(self, whisper_stages.stages)

    @property
    def name(self) -> str:
        return f"whisper.{self.label}[{self.precision}]"


class _Num:
    """The arithmetic of one precision: rounding of operands, resident weights as operands."""

    def __init__(self, precision: str):
        self.exact = precision == "fp32"
        self.precision = precision

    def rnd(self, t: torch.Tensor) -> torch.Tensor:
        return t.float() if self.exact else numerics.operand(t)

    def w(self, t: "torch.Tensor | tuple[torch.Tensor, torch.Tensor]") -> torch.Tensor:
        """A resident weight as an operand (converted once per buffer content); a (values,
        scales) pair is an int8 matrix, its group read from the shapes."""
        if isinstance(t, tuple):
            return OPERANDS.get(t, self.precision, t[0].shape[-1] // t[1].shape[-1])
        return t if self.exact else OPERANDS.get((t,), "bf16", 0)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return F.linear(self.rnd(x), self.w(w), None if b is None else self.w(b))

    def ln(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
        return F.layer_norm(self.rnd(x), (x.shape[-1],), self.w(w), self.w(b), eps)

    def act(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "gelu_new":
            name = "gelu_tanh"
        if self.exact and name == "gelu":
            return F.gelu(x)                  # transformers' GELUActivation
        return apply_epilogue(name, x)


def _staged(d: Design, inputs, outputs, pos: int = 0, n: int | None = None) -> bool:
    """numerics.layer_order() == "plan" and the block runs as stages: compute it in the stage
    programs' order (stages/whisper.py, bit-identical to the transaction level)."""
    if numerics.layer_order() != "plan" or whisper_stages.unsupported(d, n) is not None:
        return False
    whisper_stages.staged_reference(d, inputs, outputs, pos=pos, n=n)
    return True


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[n, heads*D] -> [heads, n, D]."""
    n = t.shape[0]
    return t.view(n, heads, -1).transpose(0, 1)


# -- encoder -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WhisperStemDesign(WhisperBlockDesign):
    """x = gelu(conv2(gelu(conv1(mel)))) ^T + pos.  inputs: mel [M, 2S], w1 [H,M,3], b1 [H],
    w2 [H,H,3], b2 [H], pos [S,H]; outputs: x [S,H] fp32."""

    n_mels: int
    frames: int                   # mel frames (2 * encoder positions)
    hidden: int
    precision: str
    kind = "whisper_stem"
    label = "stem"

    def conv_plans(self, gen: Generation) -> list[Plan]:
        """Both convolutions, each tiled along time so a tile's input band fits the mem tile:
        the largest tile (a divisor of the output length) that plans, its plan repeated."""
        s, h, m = self.frames // 2, self.hidden, self.n_mels
        return (_time_tiled(gen, m, self.frames, h, 1) + _time_tiled(gen, h, self.frames, h, 2))

    @inference_mode
    def reference(self, inputs, outputs, **_: Any) -> None:
        if _staged(self, inputs, outputs):
            return
        mel, w1, b1, w2, b2, pos = inputs
        num = _Num(self.precision)
        x = num.act("gelu", F.conv1d(num.rnd(mel).unsqueeze(0), num.w(w1), num.w(b1), padding=1))
        x = num.act("gelu", F.conv1d(num.rnd(x), num.w(w2), num.w(b2), stride=2, padding=1))
        outputs[0].copy_(x[0].transpose(0, 1) + num.w(pos))

    def plan(self, gen: Generation) -> Plan:
        s, h = self.frames // 2, self.hidden
        add = vector_plan(gen, "add", s, h, 2)
        return combine_plans(self.kind, self.conv_plans(gen) + [add])


def _time_tiled(gen: Generation, c_in: int, frames: int, c_out: int, stride: int) -> list[Plan]:
    """Plans of a k=3, pad=1 conv1d over `frames`, split into equal time tiles (each tile's
    input carries its 1-frame halo on both sides, so no padding inside the tiles)."""
    out = frames // stride
    last: PlanError | None = None
    for n in range(1, out + 1):
        if out % n:
            continue
        t_out = out // n
        t_in = t_out * stride + 2 if n > 1 else frames
        conv = ConvDesign((1, c_in, t_in), (c_out, c_in, 3), (stride,), (0 if n > 1 else 1,),
                          (1,), bias=True, epilogue="gelu")
        try:
            return [conv.plan(gen)] * n
        except PlanError as e:
            last = e
            if t_out <= 8:
                break
    raise last


@dataclass(frozen=True)
class WhisperEncoderLayerDesign(WhisperBlockDesign):
    """out = y + fc2(act(fc1(LN2(y)))), y = x + o(attn(qkv(LN1(x)))) (full, non-causal).

    inputs: x [S,H], ln1_w, ln1_b, w_qkv [3H,H], b_qkv [3H], w_o [H,H], b_o [H], ln2_w, ln2_b,
            w1 [F,H], b1 [F], w2 [H,F], b2 [H]; outputs: out [S,H] fp32 (may alias x)."""

    rows: int
    hidden: int
    heads: int
    ffn: int
    precision: str
    eps: float = 1e-5
    act: str = "gelu"
    kind = "whisper_encoder_layer"
    label = "encoder_layer"

    @inference_mode
    def reference(self, inputs, outputs, **_: Any) -> None:
        if _staged(self, inputs, outputs):
            return
        x, l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, w1, b1, w2, b2 = _grouped(
            inputs, (3, 5, 9, 11), self.precision)
        num, h, nh = _Num(self.precision), self.hidden, self.heads
        d = h // nh
        qkv = num.linear(num.ln(x, l1w, l1b, self.eps), wqkv, bqkv)
        q, k, v = (_heads(num.rnd(qkv[:, i * h:(i + 1) * h]), nh) for i in range(3))
        a = attend(q, k, v, scale=d ** -0.5, q_offset=self.rows, window=None, softcap=None,
                   exact=num.exact, rounded=True)
        y = num.linear(a.transpose(0, 1).reshape(-1, h), wo, bo).add_(x)
        f = num.act(self.act, num.linear(num.ln(y, l2w, l2b, self.eps), w1, b1))
        outputs[0].copy_(num.linear(f, w2, b2).add_(y))

    def plan(self, gen: Generation) -> Plan:
        s, h, f, nh = self.rows, self.hidden, self.ffn, self.heads
        d = h // nh
        p = self.precision
        stages = [layer_norm_design(s, h, self.eps).plan(gen), _mm(gen, s, h, 3 * h, p),
                  gemm_plan(gen, s, d, s, "bf16", batch=nh), vector_plan(gen, "softmax", s * nh, s),
                  gemm_plan(gen, s, s, d, "bf16", batch=nh), _mm(gen, s, h, h, p),
                  layer_norm_design(s, h, self.eps).plan(gen), _mm(gen, s, h, f, p),
                  vector_plan(gen, "gelu", s, f), _mm(gen, s, f, h, p)]
        return combine_plans(self.kind, stages)


@dataclass(frozen=True)
class WhisperCrossKVDesign(WhisperBlockDesign):
    """One decoder layer's cross-attention K = enc Wk, V = enc Wv + bv, as [heads, S, D] caches.
    With final_norm, first enc = LN(x) is computed into the enc buffer (the first launch).

    inputs: x [S,H], (ln_w, ln_b)?, w_kv [2H,H], b_kv [2H]; outputs: enc [S,H], k [nh,S,D], v."""

    rows: int
    hidden: int
    heads: int
    precision: str
    final_norm: bool
    eps: float = 1e-5
    kind = "whisper_cross_kv"
    label = "cross_kv"

    @inference_mode
    def reference(self, inputs, outputs, **_: Any) -> None:
        if _staged(self, inputs, outputs):
            return
        num, h = _Num(self.precision), self.hidden
        enc, kc, vc = outputs
        if self.final_norm:
            x, lw, lb, wkv, bkv = _grouped(inputs, (3,), self.precision)
            enc.copy_(num.ln(x, lw, lb, self.eps))
        else:
            _, wkv, bkv = _grouped(inputs, (1,), self.precision)
        kv = num.linear(enc, wkv, bkv)
        store = kc.dtype
        s = self.rows                  # the resident K / V may hold whole KV tiles (cross_rows)
        kc[:, :s].copy_(_heads(num.rnd(kv[:, :h]), self.heads).to(store))
        vc[:, :s].copy_(_heads(num.rnd(kv[:, h:]), self.heads).to(store))

    def plan(self, gen: Generation) -> Plan:
        s, h = self.rows, self.hidden
        stages = [_mm(gen, s, h, 2 * h, self.precision)]
        if self.final_norm:
            stages.insert(0, layer_norm_design(s, h, self.eps).plan(gen))
        return combine_plans(self.kind, stages)


# -- decoder -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WhisperEmbedDesign(EmbedDesign):
    """x[:n] = tok[ids[:n]] * scale + pos[pos:pos+n]: the LLM embedding (float table, group 0)
    plus learned position rows, gathered with the token rows (the plan's second table row).
    inputs: tok [V,H], pos [P,H], ids int32 [rows]; outputs: x [rows,H] fp32; scalars pos, n.
    Numerics: transformers' (the table rows as stored, not rounded to operands)."""

    kind = "whisper_embed"
    family = "whisper"
    tables_per_row = 2

    def runs(self) -> tuple:
        """One kernel run per stage program (stages/whisper.py), as the staged artifact runs."""
        return cached_runs(self, whisper_stages.stages)

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        if _staged(self, inputs, outputs, pos, n):
            return
        n = self.rows if n is None else n
        tok, table, ids = inputs
        e = tok[ids[:n].long()].float()
        if self.scale != 1.0:
            e = e * self.scale
        outputs[0][:n].copy_(e + table[pos:pos + n].float())


@dataclass(frozen=True)
class WhisperDecoderLayerDesign(WhisperBlockDesign):
    """One decoder layer for rows pos..pos+n-1:
        y = x + o(self_attn(qkv(LN1(x)), KV cache))      (K/V rows written at pos first)
        z = y + co(cross_attn(cq(LN2(y)), cross K/V))
        out = z + fc2(act(fc1(LN3(z))))

    inputs: x, ln1_w, ln1_b, w_qkv [3H,H], b_qkv, w_o, b_o, ln2_w, ln2_b, w_cq, b_cq, w_co, b_co,
            cross_k [nh,S,D], cross_v, ln3_w, ln3_b, w1, b1, w2, b2
    outputs: out [rows,H] fp32 (may alias x), k_cache [nh,C,D], v_cache [nh,C,D]
    scalars: pos, n"""

    rows: int
    hidden: int
    heads: int
    ffn: int
    capacity: int                # self-attention KV positions
    source: int                  # encoder frames (cross-attention keys)
    precision: str
    eps: float = 1e-5
    act: str = "gelu"
    kind = "whisper_decoder_layer"
    label = "decoder_layer"

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        if _staged(self, inputs, outputs, pos, n):
            return
        (x, l1w, l1b, wqkv, bqkv, wo, bo, l2w, l2b, wcq, bcq, wco, bco, ck, cv,
         l3w, l3b, w1, b1, w2, b2) = _grouped(inputs, (3, 5, 9, 11, 17, 19), self.precision)
        out, kc, vc = outputs
        n = self.rows if n is None else n
        num, h, nh = _Num(self.precision), self.hidden, self.heads
        scale = (h // nh) ** -0.5
        xs = x[:n]
        qkv = num.rnd(num.linear(num.ln(xs, l1w, l1b, self.eps), wqkv, bqkv))
        q, k, v = (_heads(qkv[:, i * h:(i + 1) * h], nh) for i in range(3))
        kc.narrow(1, pos, n).copy_(k)
        vc.narrow(1, pos, n).copy_(v)
        a = attend(q, kc.narrow(1, 0, pos + n), vc.narrow(1, 0, pos + n), scale=scale,
                   q_offset=pos, window=None, softcap=None, exact=num.exact, rounded=True)
        y = num.linear(a.transpose(0, 1).reshape(n, h), wo, bo).add_(xs)
        cq = _heads(num.rnd(num.linear(num.ln(y, l2w, l2b, self.eps), wcq, bcq)), nh)
        src = self.source              # the resident K / V may hold whole KV tiles (cross_rows)
        a = attend(cq, ck[:, :src], cv[:, :src], scale=scale, q_offset=src, window=None,
                   softcap=None, exact=num.exact, rounded=True)
        z = num.linear(a.transpose(0, 1).reshape(n, h), wco, bco).add_(y)
        f = num.act(self.act, num.linear(num.ln(z, l3w, l3b, self.eps), w1, b1))
        out[:n].copy_(num.linear(f, w2, b2).add_(z))

    def plan(self, gen: Generation) -> Plan:
        return self.plan_at(gen, kv_bucket(self.capacity, self.capacity))

    def launch_plan(self, gen: Generation, pos: int = 0, n: int | None = None, **_: Any) -> Plan:
        """The plan at this launch's self-attention extent (toolkit.kv_launch_plan)."""
        return kv_launch_plan(self, gen, pos, n)

    def plan_at(self, gen: Generation, keys: int) -> Plan:
        m, h, f, nh, s = self.rows, self.hidden, self.ffn, self.heads, self.source
        d, p = h // nh, self.precision
        cross_keys = -(-s // KV_TILE) * KV_TILE
        stages = [layer_norm_design(m, h, self.eps).plan(gen), _mm(gen, m, h, 3 * h, p),
                  gemm_plan(gen, m, d, keys, "bf16", batch=nh), vector_plan(gen, "softmax", m * nh, keys),
                  gemm_plan(gen, m, keys, d, "bf16", batch=nh), _mm(gen, m, h, h, p),
                  layer_norm_design(m, h, self.eps).plan(gen), _mm(gen, m, h, h, p),
                  gemm_plan(gen, m, d, cross_keys, "bf16", batch=nh),
                  vector_plan(gen, "softmax", m * nh, cross_keys),
                  gemm_plan(gen, m, cross_keys, d, "bf16", batch=nh), _mm(gen, m, h, h, p),
                  layer_norm_design(m, h, self.eps).plan(gen), _mm(gen, m, h, f, p),
                  vector_plan(gen, "gelu", m, f),
                  _mm(gen, m, f, h, p)]
        w = _wb(3 * h, h, p) + 3 * _wb(h, h, p) + _wb(f, h, p) + _wb(h, f, p)
        small = (6 * h + 6 * h + f + h) * (4 if p == "fp32" else 2)     # norms + biases
        cb = 4 if p == "fp32" else 2
        kv_read = 2 * nh * keys * d * cb
        cross_read = 2 * nh * s * d * cb
        kv_write = 2 * nh * m * d * cb
        read = w + small + kv_read + cross_read + m * h * 4
        return fused_plan(f"{self.name} rows={m} kv={keys}", self.kind, p, gen, stages, read,
                           kv_write + m * h * 4, m, max(h, f),
                           {"weight_bytes": w, "kv_read_bytes": kv_read + cross_read,
                            "kv_write_bytes": kv_write})


@dataclass(frozen=True)
class WhisperHeadDesign(WhisperBlockDesign):
    """logits[0] = LN(x[n-1]) @ E^T (the output projection tied to the token embedding).
    inputs: x [rows,H], ln_w, ln_b, proj [V,H]; outputs: logits [1,V] fp32."""

    hidden: int
    rows: int
    vocab: int
    precision: str
    eps: float = 1e-5
    kind = "whisper_head"
    label = "head"

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        if _staged(self, inputs, outputs, pos, n):
            return
        x, lw, lb, proj = _grouped(inputs, (3,), self.precision)
        n = self.rows if n is None else n
        num = _Num(self.precision)
        outputs[0].copy_(num.linear(num.ln(x[n - 1:n], lw, lb, self.eps), proj, None))

    def plan(self, gen: Generation) -> Plan:
        stages = [layer_norm_design(1, self.hidden, self.eps).plan(gen),
                  _mm(gen, 1, self.hidden, self.vocab, self.precision)]
        w = _wb(self.vocab, self.hidden, self.precision)
        return fused_plan(f"{self.name} vocab={self.vocab}", self.kind, self.precision, gen,
                           stages, w + 2 * self.hidden * 4 + self.hidden * 4, self.vocab * 4, 1,
                           self.hidden, {"weight_bytes": w})


def step_designs(spec, precision: "str | Mapping[str, str]", rows: int, capacity: int
                 ) -> list[Design]:
    """The launches of one decoder chunk: embed, one per layer, head (the decoder's precision)."""
    h = spec.d_model
    precision = split_precision(precision)[1]
    out: list[Design] = [WhisperEmbedDesign(spec.vocab, h, rows, _float(precision), group=0,
                                             scale=spec.embed_scale)]
    layer = WhisperDecoderLayerDesign(rows, h, spec.decoder_heads, spec.decoder_ffn, capacity,
                                      spec.source_positions, precision, spec.eps, spec.act)
    out += [layer] * spec.decoder_layers
    out.append(WhisperHeadDesign(h, rows, spec.vocab, precision, spec.eps))
    return out


def encoder_designs(spec, precision: "str | Mapping[str, str]") -> list[Design]:
    """The launches of the encoder Program: stem, layers, then cross K/V per decoder layer (the
    encoder's precision)."""
    s, h = spec.source_positions, spec.d_model
    precision = split_precision(precision)[0]
    out: list[Design] = [WhisperStemDesign(spec.n_mels, spec.mel_frames, h, _float(precision))]
    layer = WhisperEncoderLayerDesign(s, h, spec.encoder_heads, spec.encoder_ffn, precision,
                                      spec.eps, spec.act)
    out += [layer] * spec.encoder_layers
    for i in range(spec.decoder_layers):
        out.append(WhisperCrossKVDesign(s, h, spec.decoder_heads, precision, i == 0, spec.eps))
    return out

