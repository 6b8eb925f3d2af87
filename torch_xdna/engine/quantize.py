"""Weight quantizers for the decode engine: per-site formats the fused LLM blocks read.

Formats (weights in nn.Linear layout [N, K], groups run along K, the reduction dimension):
  fp32   (w fp32)                                     verification mode, not NPU numerics
  bf16   (w bf16)
  int8   (q int8 [N,K], scales bf16 [N,K/g])          symmetric, q in [-127, 127]
  int4   (packed uint8 [N,K/2], scales bf16 [N,K/g])  symmetric, q in [-7, 7], nibble = q + 8,
                                                      even k in the low nibble
  bfp16  (mantissas int8 [N,K], exponents uint8 [N,K/8])  8 values share an exponent; mantissas
                                                      truncate toward -inf (9 bytes per 8 values)
The reading side (what the core does with these bytes) is kernels/llm_blocks.dequantize.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.llm_blocks import BFP_BLOCK, PRECISIONS, default_group

__all__ = ["quantize", "PRECISIONS", "default_group"]


def quantize(w: torch.Tensor, precision: str, group: int | None = None) -> tuple[torch.Tensor, ...]:
    """The stored tensors of weight `w` [N, K] in `precision` (see module docstring)."""
    w = w.detach().float()
    if precision == "fp32":
        return (w.contiguous(),)
    if precision == "bf16":
        return (w.to(torch.bfloat16).contiguous(),)
    if precision == "bfp16":
        return _bfp16(w)
    if precision in ("int8", "int4"):
        g = group or default_group(precision)
        n, k = w.shape
        if k % g:
            raise ValueError(f"{precision} quantization: K={k} is not a multiple of the group size "
                             f"{g}; pick a group size that divides it")
        qmax = 127 if precision == "int8" else 7
        wg = w.view(n, k // g, g)
        scale = (wg.abs().amax(-1, keepdim=True) / qmax).to(torch.bfloat16).float()
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        q = torch.clamp(torch.round(wg / scale), -qmax, qmax).to(torch.int8).view(n, k)
        scales = scale.view(n, k // g).to(torch.bfloat16).contiguous()
        if precision == "int8":
            return (q.contiguous(), scales)
        u = (q + 8).to(torch.uint8).view(n, k // 2, 2)
        return ((u[..., 0] | (u[..., 1] << 4)).contiguous(), scales)
    raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")


def _bfp16(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    if k % BFP_BLOCK:
        raise ValueError(f"bfp16: K={k} is not a multiple of the block size {BFP_BLOCK}")
    blocks = w.view(n, k // BFP_BLOCK, BFP_BLOCK)
    amax = blocks.abs().amax(-1, keepdim=True)
    # shared exponent e: amax in [2^e, 2^(e+1)); mantissa step 2^(e-6) keeps |m| <= 127
    e = torch.floor(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax))))
    e = torch.clamp(e, -126, 127)
    step = torch.pow(2.0, e - 6)
    m = torch.clamp(torch.floor(blocks / step), -128, 127).to(torch.int8)
    return m.view(n, k).contiguous(), (e + 127).to(torch.uint8).view(n, k // BFP_BLOCK).contiguous()
