"""Fused pre-norm rotary encoder blocks (ModernBERT, ESM-2): one launch each for the embedding,
a layer's attention, a layer's FFN and the final norm.

Where BERT adds, then norms (kernels/blocks/encoder.py), these norm, then add: x + f(LN(x)). The
attention rotates Q and K (rotate-half RoPE from a resident cos/sin table) and may be local:
ModernBERT's sliding layers let a token see keys within `window` positions (|i - j| <= window),
every third layer global. The FFN is plain (ESM: gelu) or gated (ModernBERT's GeGLU:
act(x W_in) * (x W_gate)). Absent biases (ModernBERT) are resident zeros: adding zero is exact.

Numerics: "bf16" rounds every GEMM / attention operand to bf16 with fp32 accumulation (the
NPU's policy, kernels/numerics.py); "fp32" is the verification mode (nothing rounded). Each
sequence is computed over its own tokens only (the mask's prefix), so a vector never depends on
its batch partners or the padded length. Plans are the components' plans combined; a local
layer's score and P V GEMMs are charged for its 2 x window + 1 keys, not the whole sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.blocks.encoder import (FusedBlock, layer_norm_design, linear_rows,
                                               prefix_lengths, real_rows, scatter_rows)
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import EmbeddingDesign, VectorDesign

_F32 = torch.float32


def rope_table(positions: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim] as transformers' default RoPE computes them (fp32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(positions).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float, exact: bool) -> torch.Tensor:
    if exact:
        return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps)
    out = torch.empty(x.shape, dtype=_F32)
    layer_norm_design(x.shape[0], x.shape[1], eps).reference([x.float(), w, b], [out])
    return out


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, exact: bool,
            act: str = "none") -> torch.Tensor:
    if exact:
        return apply_epilogue(act, torch.addmm(b.float(), x.float(), w.float()))
    return linear_rows(x, w, b, act=act)


def _rounder(exact: bool):
    return (lambda t: t) if exact else numerics.operand


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rows_of(mask: torch.Tensor, batch: int, seq: int) -> tuple[list[int], torch.Tensor]:
    lengths = prefix_lengths(mask.view(batch, seq))
    if lengths is None:
        raise ValueError("pre-norm encoder blocks take prefix masks (0 ... 0, -inf ... -inf) only")
    return lengths, real_rows(lengths, seq)


@dataclass(frozen=True)
class PreNormEmbeddingDesign(FusedBlock):
    """x = LN?(word[ids] * scale): inputs word [V,H], ln_w [H], ln_b [H], ids int32 [B*S],
    scale fp32 [B*S] (ESM's token-dropout factor per row; ones otherwise); output [B*S,H]."""

    vocab: int
    hidden: int
    batch: int
    seq: int
    eps: float
    norm: bool = True
    table_dtype: torch.dtype = torch.bfloat16
    precision: str = "bf16"
    kind = "prenorm_embedding"

    def components(self) -> list[Design]:
        rows, h = self.batch * self.seq, self.hidden
        parts: list[Design] = [EmbeddingDesign(self.vocab, h, rows, self.table_dtype),
                               VectorDesign("mul", ((rows, h), (rows, 1)), (_F32, _F32), (rows, h),
                                            _F32)]
        return parts + ([layer_norm_design(rows, h, self.eps)] if self.norm else [])

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        word, ln_w, ln_b, ids, scale = inputs
        exact = self.precision == "fp32"
        x = word[ids.long()].float() * _rounder(exact)(scale.float()).unsqueeze(1)
        outputs[0].copy_(_norm(x, ln_w, ln_b, self.eps, exact) if self.norm else x)


@dataclass(frozen=True)
class PreNormAttentionDesign(FusedBlock):
    """out = x + Wo attn(rope(Q), rope(K), V) + bo with QKV = LN?(x) Wqkv + bqkv.

    inputs: x [B*S,H], ln_w [H], ln_b [H], w_qkv [H,3H], b_qkv [3H], mask [B,S] (additive prefix
    mask), w_o [H,H], b_o [H], cos [P,D], sin [P,D]; output [B*S,H] fp32 (padding rows zero)."""

    batch: int
    seq: int
    hidden: int
    heads: int
    eps: float
    window: int = 0             # 0: global; else keys with |i - j| <= window
    norm: bool = True           # ModernBERT's first layer has no attention norm
    precision: str = "bf16"
    kind = "prenorm_attention"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def components(self) -> list[Design]:
        b, s, h, nh, d = self.batch, self.seq, self.hidden, self.heads, self.head_dim
        rows, keys = b * s, min(s, 2 * self.window + 1) if self.window else s
        parts: list[Design] = [layer_norm_design(rows, h, self.eps)] if self.norm else []
        return parts + [
            GemmDesign(rows, h, 3 * h, dtype="bf16", bias=True),
            VectorDesign("mul", ((2 * rows, h), (2 * rows, h)), (_F32, _F32), (2 * rows, h), _F32),
            GemmDesign(s, d, keys, batch=b * nh, dtype="bf16"),
            VectorDesign("softmax", ((b * nh * s, keys),), (_F32,), (b * nh * s, keys), _F32,
                         (("dim", -1),)),
            GemmDesign(s, keys, d, batch=b * nh, dtype="bf16"),
            GemmDesign(rows, h, h, dtype="bf16", bias=True, residual=True)]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, ln_w, ln_b, w_qkv, b_qkv, mask, w_o, b_o, cos_t, sin_t = inputs
        exact, nh, d = self.precision == "fp32", self.heads, self.head_dim
        rnd = _rounder(exact)
        lengths, rows = _rows_of(mask, self.batch, self.seq)
        xr = x.index_select(0, rows).float()
        h = _norm(xr, ln_w, ln_b, self.eps, exact) if self.norm else xr
        qkv = _linear(h, w_qkv, b_qkv, exact)
        cos, sin = rnd(cos_t.float()), rnd(sin_t.float())
        ctx = torch.empty(len(rows), self.hidden)
        off = 0
        for n in lengths:
            if not n:
                continue
            q, k, v = qkv[off:off + n].view(n, 3, nh, d).permute(1, 2, 0, 3)  # [nh, n, d]
            q, k = _rotate(rnd(q), cos[:n], sin[:n]), _rotate(rnd(k), cos[:n], sin[:n])
            scores = torch.matmul(rnd(q), rnd(k).transpose(-1, -2)) * (1.0 / math.sqrt(d))
            if self.window:
                i = torch.arange(n)
                scores = scores.masked_fill((i[:, None] - i[None, :]).abs() > self.window,
                                            float("-inf"))
            p = rnd(torch.softmax(scores, dim=-1))
            ctx[off:off + n] = torch.matmul(p, rnd(v)).transpose(0, 1).reshape(n, self.hidden)
            off += n
        y = _linear(ctx, w_o, b_o, exact) + xr
        scatter_rows(outputs[0], rows, y)


@dataclass(frozen=True)
class PreNormFFNDesign(FusedBlock):
    """out = x + W2 f(LN(x)) + b2 with f = act(. W1 + b1) or, gated, act(. W_in) * (. W_gate).

    inputs: x [R,H], ln_w [H], ln_b [H], w1 [H, I or 2I (gated: input half, then gate half)],
    b1, w2 [I,H], b2 [H], mask [R/S, S]; output [R,H] fp32 (padding rows zero)."""

    batch: int
    seq: int
    hidden: int
    intermediate: int
    eps: float
    act: str = "gelu"
    gated: bool = False
    precision: str = "bf16"
    kind = "prenorm_ffn"

    def components(self) -> list[Design]:
        rows, h, i = self.batch * self.seq, self.hidden, self.intermediate
        up = GemmDesign(rows, h, 2 * i if self.gated else i, dtype="bf16", bias=True,
                        epilogue="none" if self.gated else self.act)
        gate = [VectorDesign(self.act, ((rows, i),), (_F32,), (rows, i), _F32),
                VectorDesign("mul", ((rows, i), (rows, i)), (_F32, _F32), (rows, i), _F32)]
        return [layer_norm_design(rows, h, self.eps), up, *(gate if self.gated else []),
                GemmDesign(rows, i, h, dtype="bf16", bias=True, residual=True)]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, ln_w, ln_b, w1, b1, w2, b2, mask = inputs
        exact = self.precision == "fp32"
        _, rows = _rows_of(mask, self.batch, self.seq)
        xr = x.index_select(0, rows).float()
        h = _norm(xr, ln_w, ln_b, self.eps, exact)
        if self.gated:
            up = _linear(h, w1, b1, exact)
            a, g = up[:, :self.intermediate], up[:, self.intermediate:]
            inter = apply_epilogue(self.act, _rounder(exact)(a)) * _rounder(exact)(g)
        else:
            inter = _linear(h, w1, b1, exact, act=self.act)
        scatter_rows(outputs[0], rows, _linear(inter, w2, b2, exact) + xr)


@dataclass(frozen=True)
class EncoderNormDesign(FusedBlock):
    """The final LayerNorm over the token rows: inputs x [B*S,H], ln_w, ln_b, mask [B,S];
    output [B*S,H] fp32 (padding rows zero)."""

    batch: int
    seq: int
    hidden: int
    eps: float
    precision: str = "bf16"
    kind = "encoder_norm"

    def components(self) -> list[Design]:
        return [layer_norm_design(self.batch * self.seq, self.hidden, self.eps)]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, ln_w, ln_b, mask = inputs
        _, rows = _rows_of(mask, self.batch, self.seq)
        y = _norm(x.index_select(0, rows), ln_w, ln_b, self.eps, self.precision == "fp32")
        scatter_rows(outputs[0], rows, y)
