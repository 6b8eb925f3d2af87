"""Weight quantization at load: one weight site -> the stored tensors the fused blocks read.

Formats (weights in nn.Linear layout [N, K], groups along K) are kernels/quant.py's:
  fp32   (w fp32)                                     verification mode, not NPU numerics
  bf16   (w bf16)
  int8   (q int8 [N,K], scales bf16 [N,K/g])          symmetric, weight-only
  int4   (packed uint8 [N,K/2], scales bf16 [N,K/g])  symmetric, weight-only
  bfp16  (blocks uint8 [N, K/8*9])                    8 values share an exponent
  mxfp4  (codes uint8 [N,K/2], scales uint8 [N,K/32]) E2M1 values, E8M0 scale per 32 (OCP MX)
The reading side is kernels/llm_blocks.dequantize.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels import quant
from torch_xdna.kernels.blocks.weights import PRECISIONS, default_group

__all__ = ["quantize", "PRECISIONS", "default_group"]


def quantize(w: "torch.Tensor | tuple[torch.Tensor, torch.Tensor]", precision: str,
             group: int = 0) -> tuple[torch.Tensor, ...]:
    """The stored tensors of weight `w` [N, K] in `precision` (see the module docstring). `w`
    may already be stored as MXFP4 (codes, scales) (a gpt-oss checkpoint's experts): kept byte
    for byte for an mxfp4 site, decoded (exactly) and converted for any other."""
    if isinstance(w, tuple):
        if precision == "mxfp4":
            return tuple(t.contiguous() for t in w)
        w = quant.decode_mxfp4(*w)
    w = w.detach().float()
    if precision == "fp32":
        return (w.contiguous(),)
    if precision == "bf16":
        return (w.to(torch.bfloat16).contiguous(),)
    if precision == "bfp16":
        return (quant.encode_bfp16(w).contiguous(),)
    if precision == "mxfp4":            # lossless for weights that already are MXFP4 values
        return tuple(t.contiguous() for t in quant.encode_mxfp4(w))
    g = group or default_group(precision)
    if precision == "int8":
        q, s = quant.quantize_int8(w, g)
    elif precision == "int4":
        q, s = quant.quantize_int4(w, g)
    else:
        raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return q.contiguous(), s.contiguous()
