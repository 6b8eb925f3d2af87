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
numerics a model site uses is chosen by a NumericsPlan (kernels/numerics_plan.py).
"""
from __future__ import annotations

import torch

from torch_xdna.runtime import settings

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
        return operand_bf16(x, ftz).float()
    y = bf16_round(x, rounding)
    return flush_subnormals(y) if ftz else y


def operand_bf16(x: torch.Tensor, ftz: bool = True) -> torch.Tensor:
    """operand(x) in its 2-byte form: a float tensor rounded (RNE) to bf16, subnormals flushed
    (the same values operand() returns, as a bf16 tensor; `x` itself when it already is one)."""
    # round and flush on the 2-byte form: a bf16 subnormal has a zero exponent field
    b = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
    # cheap screen first (sim speed: 2 ops instead of 3 + a Python scalar per call): only a
    # tensor whose smallest magnitude is below the normal range (or NaN) can hold subnormals
    if ftz and b.numel() and not float(b.abs().min()) >= FP32_MIN_NORMAL:
        tiny = (b.view(torch.int16) & 0x7F80) == 0
        b = torch.where(tiny, b * 0, b)           # keeps the sign of zero
    return b


# the largest bf16 subnormal, as fp32: a value above it is a normal number (or inf)
_BF16_MAX_SUBNORMAL = FP32_MIN_NORMAL * (1.0 - 2.0 ** -7)
BF16_MAX_SUBNORMAL = _BF16_MAX_SUBNORMAL   # public name (host kernels flush at it)


def operand_nonneg(x: torch.Tensor) -> torch.Tensor:
    """operand(x) (RNE to bf16, subnormals flushed, held in fp32) for a float tensor known to hold
    no negatives and no NaN (softmax probabilities): the flush is one threshold pass instead of
    operand's screen, mask and select (sim speed; the same values, bit for bit)."""
    y = x.to(torch.bfloat16).float()
    return torch.nn.functional.threshold_(y, _BF16_MAX_SUBNORMAL, 0.0)


def gemm_operand(x: torch.Tensor) -> torch.Tensor:
    """operand(x) for a float tensor that only feeds GEMM products (sim speed): RNE to bf16, then
    one hardshrink pass flushes the subnormals, held in fp32; 3 passes where operand takes 4 (8
    when it finds subnormals, as after a GELU). It differs from operand only in the sign of a
    flushed zero (always +0 here), which no product sum can see: an fp32 accumulator starting
    at +0 plus any mix of signed-zero products stays +0, and a nonzero sum ignores them."""
    if x.dtype not in FLOAT_DTYPES:
        return x
    return gemm_operand_bf16(x).float()


def gemm_operand_bf16(x: torch.Tensor) -> torch.Tensor:
    """gemm_operand(x) in its 2-byte form (bf16): a caller that lays the operand out anew
    converts and moves it in one copy."""
    b = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
    return torch.nn.functional.hardshrink(b, _BF16_MAX_SUBNORMAL)


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


# -- float GEMM accumulation order ---------------------------------------------------------------
# A core's mmul adds one K tile of products into its fp32 accumulator per kernel call, K tile by
# K tile (kernels/lower/gemm.py). Model: a tile's products are summed exactly and rounded once
# to fp32 (RNE), then added to the fp32 accumulator in tile order. Both simulator levels use
# these two functions, so they agree bit for bit. "Exactly": bf16 x bf16 products carry <= 16
# significant bits and a tile holds <= 256 of them, so their fp64 sum is exact (in any order)
# while a tile's nonzero products lie within 2^29 of each other in magnitude; beyond that the
# fp64 sums may round (at 2^-53 relative), which can move the fp32 result by 1 ulp of the tile's
# sum. BLAS fp32 results are not usable here: they depend on the call's shape (edge kernels,
# GEMV paths, thread splits), so a tile's product would differ from the same elements of a
# whole-matrix product.
_KTILE_BLOCK_BYTES = 32 << 20          # fp64 tile products materialized at once (host memory)
GEMM_ORDERS = settings.choices("TORCH_XDNA_GEMM_ORDER")


def gemm_order() -> str:
    """TORCH_XDNA_GEMM_ORDER: "plan" (default) makes float GEMM references follow the plan's K
    tiles (ktile_matmul; bit-identical to the transaction level); "blas" is one fp32 BLAS
    matmul (host speed: several times faster when the plan's K tile is small, but then the
    levels agree only within fp32 reordering, and results depend on the BLAS); "kernel" is the
    C++ core kernels' own order (each output adds its products one by one in ascending k,
    golden.matmul_seq; bit-identical to the emulated NPU, slower). `use_gemm_order` overrides
    it for the calling thread."""
    return settings.get("TORCH_XDNA_GEMM_ORDER")


def use_gemm_order(name: str):
    """Float GEMM references in accumulation order `name` (GEMM_ORDERS) in this thread."""
    return settings.override("TORCH_XDNA_GEMM_ORDER", name)


LAYER_ORDERS = settings.choices("TORCH_XDNA_LAYER_ORDER")


def layer_order() -> str:
    """TORCH_XDNA_LAYER_ORDER: "blas" (default) runs the fused decoder layer's functional
    reference as llm_blocks writes it (fp32 BLAS GEMMs, host speed: the decode loop's path);
    "plan" runs it in its stage programs' order (kernels/llm_layer_stages.staged_reference:
    K-tile GEMMs, the attention design's flash order), bit-identical to the transaction level.
    The two agree within fp32 reordering."""
    return settings.get("TORCH_XDNA_LAYER_ORDER")


def tile_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """One K tile: a [.., m, k] @ b [.., k, n], products summed exactly, rounded once to fp32."""
    return torch.matmul(a.double(), b.double()).float()


def ktile_matmul(a: torch.Tensor, b: torch.Tensor, tk: int) -> torch.Tensor:
    """a [.., M, K] @ b [.., K, N] (float operands) accumulated as the array does: per K tile of
    `tk` an exact tile product rounded to fp32 (tile_dot), added to an fp32 accumulator that
    starts at +0, tile after tile. Vectorised: fp64 BLAS per group of tiles, one fp32 add per
    tile over the output; rows and columns are processed in pieces so the fp64 copies stay
    within _KTILE_BLOCK_BYTES (an LM head's weight is not copied whole)."""
    K = a.shape[-1]
    M, N = a.shape[-2], b.shape[-1]
    shape = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (M, N)
    if K == 0 or M == 0 or N == 0:
        return torch.zeros(shape)
    lead = max(1, int(torch.Size(shape[:-2]).numel()))
    cap = max(1, _KTILE_BLOCK_BYTES // (8 * K * lead))
    if M <= cap and N <= cap:
        return _ktile_piece(a, b, tk, shape)
    out = torch.empty(shape)
    for r0 in range(0, M, cap):
        for c0 in range(0, N, cap):
            ap, bp = a[..., r0:r0 + cap, :], b[..., c0:c0 + cap]
            piece = torch.broadcast_shapes(ap.shape[:-2], bp.shape[:-2]) + (ap.shape[-2], bp.shape[-1])
            out[..., r0:r0 + cap, c0:c0 + cap] = _ktile_piece(ap, bp, tk, piece)
    return out


def _ktile_piece(a: torch.Tensor, b: torch.Tensor, tk: int, shape) -> torch.Tensor:
    K = a.shape[-1]
    kt = max(1, -(-K // tk))
    out = torch.zeros(shape)
    if kt == 1:
        return out.add_(tile_dot(a, b))
    a64, b64 = a.double(), b.double()
    # group tiles so each group's fp64 products stay within _KTILE_BLOCK_BYTES
    g = max(1, min(kt, _KTILE_BLOCK_BYTES // (8 * out.numel())))
    for t0 in range(0, kt, g):
        t1 = min(kt, t0 + g)
        lo, hi = t0 * tk, min(K, t1 * tk)
        if t1 - t0 == 1:
            out.add_(torch.matmul(a64[..., lo:hi], b64[..., lo:hi, :]).float())
            continue
        pad = (t1 - t0) * tk - (hi - lo)          # the last tile's missing K: zeros (exact)
        aa, bb = a64[..., lo:hi], b64[..., lo:hi, :]
        if pad:
            aa = torch.nn.functional.pad(aa, (0, pad))
            bb = torch.nn.functional.pad(bb, (0, 0, 0, pad))
        n = t1 - t0
        at = aa.unflatten(-1, (n, tk)).movedim(-2, -3)             # [.., n, M, tk]
        bt = bb.unflatten(-2, (n, tk))                               # [.., n, tk, N]
        p = torch.matmul(at, bt).float()                             # [.., n, M, N]
        for i in range(n):
            out.add_(p.select(-3, i))
    return out
