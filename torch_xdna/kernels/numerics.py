"""The NPU's numerics, as one documented policy.

Operand policy (applies to every float kernel): floating operands enter the array as bf16,
rounded to nearest-even (what AIE2P kernels set; the hardware default truncates toward -inf);
subnormals are flushed to zero (the AIE-ML float path has no denormals); products and sums
accumulate in fp32; the result is stored in the requested output dtype. So an fp32 tensor is
computed as bf16 operands with fp32 accumulation. Pure additions/subtractions run on the fp32
accumulator path and are exact in fp32, as are ops that only compare, select or clamp
(vector.EXACT_FP32); sin/cos keep the fp32 angle (vector.FP32_OPERAND) because a bf16 angle would
ruin rotary embeddings at large positions. int8 x int8 accumulates in int32.

Block floating point (bfp16) and int8/int4 weight quantization live in kernels/quant.py; which
numerics a model site uses is chosen by a PrecisionPlan (kernels/precision.py).
"""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
INT_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)

ROUND_NEAREST_EVEN = "rne"
ROUND_TOWARD_NEG_INF = "floor"
ROUNDING_MODES = (ROUND_NEAREST_EVEN, ROUND_TOWARD_NEG_INF)
FP32_MIN_NORMAL = 2.0 ** -126          # bf16 shares fp32's exponent range


def flush_subnormals(x: torch.Tensor) -> torch.Tensor:
    """Subnormal values become (signed) zero, as the array's float units do."""
    if not x.dtype.is_floating_point:
        return x
    tiny = (x.abs() < FP32_MIN_NORMAL) & (x != 0)
    return torch.where(tiny, x * 0.0, x) if bool(tiny.any()) else x


def bf16_round(x: torch.Tensor, mode: str = ROUND_NEAREST_EVEN) -> torch.Tensor:
    """Round a float tensor to bf16-representable values, returned as fp32."""
    x = x.float()
    if mode == ROUND_NEAREST_EVEN:
        return x.to(torch.bfloat16).float()
    if mode == ROUND_TOWARD_NEG_INF:
        bits = x.contiguous().view(torch.int32)
        trunc = (bits & ~0xFFFF).view(torch.float32)   # toward zero
        # negative values with discarded bits move one ulp further down
        neg_inexact = (x < 0) & ((bits & 0xFFFF) != 0) & torch.isfinite(x)
        down = ((bits & ~0xFFFF) + 0x10000).view(torch.float32)
        return torch.where(neg_inexact, down, trunc)
    raise ValueError(f"unknown bf16 rounding mode {mode!r}; use one of {ROUNDING_MODES}")


def operand(x: torch.Tensor, rounding: str = ROUND_NEAREST_EVEN, ftz: bool = True) -> torch.Tensor:
    """An operand as the array sees it: floats as bf16 (rounded by `rounding`, subnormals flushed)
    held in fp32; integers unchanged."""
    if x.dtype not in FLOAT_DTYPES:
        return x
    if rounding == ROUND_NEAREST_EVEN or x.dtype == torch.bfloat16:
        # round (RNE) and flush on the 2-byte form: a bf16 subnormal has a zero exponent field
        b = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        # cheap screen first (sim speed: 2 ops instead of 3 + a Python scalar per call): only a
        # tensor whose smallest magnitude is below the normal range (or NaN) can hold subnormals
        if ftz and b.numel() and not float(b.abs().min()) >= FP32_MIN_NORMAL:
            tiny = (b.view(torch.int16) & 0x7F80) == 0
            b = torch.where(tiny, b * 0, b)           # keeps the sign of zero
        return b.float()
    y = bf16_round(x, rounding)
    return flush_subnormals(y) if ftz else y


# the largest bf16 subnormal, as fp32: a value above it is a normal number (or inf)
_BF16_MAX_SUBNORMAL = FP32_MIN_NORMAL * (1.0 - 2.0 ** -7)


def operand_nonneg(x: torch.Tensor) -> torch.Tensor:
    """operand(x) (RNE to bf16, subnormals flushed, held in fp32) for a float tensor known to hold
    no negatives and no NaN (softmax probabilities): the flush is one threshold pass instead of
    operand's screen, mask and select (sim speed; the same values, bit for bit)."""
    y = x.to(torch.bfloat16).float()
    return torch.nn.functional.threshold_(y, _BF16_MAX_SUBNORMAL, 0.0)


def store(result: torch.Tensor, out: torch.Tensor) -> None:
    """Write an fp32/int32 accumulator result into the output view in its dtype."""
    out.copy_(result.to(out.dtype) if result.dtype != out.dtype else result)


def dtype_name(dtype: torch.dtype) -> str:
    """The numerics class a torch dtype maps to on the array."""
    if dtype in FLOAT_DTYPES:
        return "bf16"
    if dtype in (torch.int8, torch.uint8):
        return "int8"
    return "int32"
