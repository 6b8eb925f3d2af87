"""Stored weight formats of the fused blocks: the one precision table and what follows from it.

A block's `precision` names the format its resident weights are stored in and the numerics its
matmuls run with: "bf16" (the NPU's operands), "int8" / "int4" (groups of values along K with a
bf16 scale each, dequantized to bf16 on the core), "bfp16" (block floating point, both operands
as blocks) and "fp32" (a verification mode: nothing rounded; not what the NPU computes). The
formats themselves are in kernels/quant.py; the engine's quantizer (engine/llm/quantize.py)
writes them. Subsets of the table (below) name the precisions one family of blocks supports.
"""
from __future__ import annotations

from typing import Sequence

import torch

from torch_xdna.kernels import numerics, quant

PRECISIONS = ("fp32", "bf16", "int8", "int4", "bfp16")
# int8 / int4: a weight is stored as values plus per-group scales (two tensors)
GROUPED_PRECISIONS = tuple(p for p in PRECISIONS if p in ("int8", "int4"))
# what the Whisper blocks take: float weights, or int8 matrices (weight-only, group scales)
WHISPER_PRECISIONS = tuple(p for p in PRECISIONS if p in ("fp32", "bf16", "int8"))
# the decoder layer's stage programs (kernels/stages/llm_layer.py): bf16 or weight-only groups
STAGED_PRECISIONS = tuple(p for p in PRECISIONS if p == "bf16" or p in GROUPED_PRECISIONS)
_GROUPS = {"int8": 128, "int4": 32}


def default_group(precision: str) -> int:
    """Group size (along K) of a precision's scales; 0 when it has none."""
    return _GROUPS.get(precision, 0)


def weight_tensors(precision: str) -> int:
    """How many stored tensors one weight site has in `precision` (int8/int4: values + scales)."""
    return 2 if precision in GROUPED_PRECISIONS else 1


def weight_bytes(n: int, k: int, precision: str, group: int = 0) -> int:
    """Bytes one [N, K] weight occupies (and streams) in `precision`."""
    g = group or default_group(precision) or k
    nk = n * k
    if precision == "bfp16":
        return n * quant.bfp16_nbytes(k)
    return {"fp32": 4 * nk, "bf16": 2 * nk, "int8": nk + nk // g * 2,
            "int4": nk // 2 + nk // g * 2}[precision]


def mm_dtype(precision: str) -> str:
    """The GEMM operand dtype of a precision (the fp32 verification mode plans as bf16)."""
    return "bf16" if precision == "fp32" else precision


def dequantize(tensors: Sequence[torch.Tensor], precision: str, group: int = 0) -> torch.Tensor:
    """A stored weight [N, K] as the core's matmul sees it (fp32 holding bf16 / bfp16 values;
    exact fp32 in the fp32 verification mode)."""
    w = tensors[0]
    if precision == "fp32":
        return w.float()
    if precision == "bf16":
        return numerics.operand(w)
    if precision == "bfp16":
        return quant.decode_bfp16(w)
    g = group or default_group(precision)
    if precision == "int4":
        return numerics.bf16_round(quant.dequantize_int4(w, tensors[1], g))
    if precision == "int8":
        return numerics.bf16_round(quant.dequantize_int8(w, tensors[1], g))
    raise ValueError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
