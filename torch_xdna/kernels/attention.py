"""Attention with the NPU's numerics (bf16 operands, fp32 accumulation and softmax).

`attention_reference` is shared by every design that contains attention (the AttentionDesign of
the compiler, the fused LLM and encoder blocks): keep its signature stable.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels import numerics


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                        causal: bool = False, mask: torch.Tensor | None = None,
                        q_offset: int = 0, window: int | None = None,
                        softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for q [B,Hq,Sq,D], k/v [B,Hkv,Skv,D] (GQA when Hq > Hkv).

    causal: query i (at absolute position q_offset + i) sees keys 0..q_offset+i.
    window: sliding window size (keys older than pos - window + 1 are masked).
    Returns fp32 [B,Hq,Sq,D].
    """
    q, k, v = numerics.operand(q), numerics.operand(k), numerics.operand(v)
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
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
    p = torch.nan_to_num(p, nan=0.0)            # fully-masked rows give zeros, not NaN
    return torch.matmul(numerics.operand(p), v)
