"""The encoder blocks' fp32 verification mode: the same dataflow as kernels/blocks/encoder.py in
plain fp32 (nothing rounded to bf16). Not what the NPU computes: it exists so a model's loading,
layout and block math can be checked against transformers to fp32 precision, apart from the
NPU's bf16 operand rounding (which the default mode adds, and whose error is stated beside
transformers' own bf16 run in the tests)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from torch_xdna.kernels.activations import apply_epilogue


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps)


def embedding(word: torch.Tensor, pos: torch.Tensor, typ: torch.Tensor, ln_w: torch.Tensor,
              ln_b: torch.Tensor, ids: torch.Tensor, types: torch.Tensor | None, batch: int,
              seq: int, eps: float) -> torch.Tensor:
    """LayerNorm(word[ids] + pos[0..S) + type[t]) in fp32: [B*S, H]."""
    h = word.shape[1]
    x = word.float()[ids.long()].view(batch, seq, h) + pos[:seq].float()
    t = types.long().clamp(0, typ.shape[0] - 1) if types is not None else torch.zeros_like(ids).long()
    x = x.view(batch * seq, h) + typ.float()[t]
    return layer_norm(x, ln_w, ln_b, eps)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(QK^T/sqrt(D) + mask) V in fp32; rows with every key masked give zeros."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1).nan_to_num_(0.0), v)


def attention(x: torch.Tensor, w_qkv: torch.Tensor, b_qkv: torch.Tensor, mask: torch.Tensor,
              w_o: torch.Tensor, b_o: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor,
              batch: int, seq: int, heads: int, eps: float) -> torch.Tensor:
    """Post-norm BERT attention in fp32: LayerNorm(x + attn(x) Wo + bo); weights [K, N]."""
    h = x.shape[1]
    d = h // heads
    qkv = torch.addmm(b_qkv.float(), x.float(), w_qkv.float())
    q, k, v = qkv.view(batch, seq, 3, heads, d).permute(2, 0, 3, 1, 4)
    ctx = attention_core(q, k, v, mask.float().view(batch, 1, 1, seq))
    y = torch.addmm(b_o.float(), ctx.permute(0, 2, 1, 3).reshape(batch * seq, h), w_o.float())
    return layer_norm(y + x.float(), ln_w, ln_b, eps)


def ffn(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor,
        ln_w: torch.Tensor, ln_b: torch.Tensor, act: str, eps: float) -> torch.Tensor:
    """Post-norm BERT FFN in fp32: LayerNorm(x + act(x W1 + b1) W2 + b2); weights [K, N]."""
    inter = apply_epilogue(act, torch.addmm(b1.float(), x.float(), w1.float()))
    return layer_norm(torch.addmm(b2.float(), inter, w2.float()) + x.float(), ln_w, ln_b, eps)
