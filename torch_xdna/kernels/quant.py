"""Quantized numerics: bfp16 blocks (AIE2P v8bfp16ebs8), int8/int4 weights with group scales and
MXFP4 weights (OCP microscaling: E2M1 values, one E8M0 scale per 32).

bfp16 ("bfp16ebs8"): 8 values share one 8-bit exponent (the largest biased fp32 exponent in the
block) and each keeps an 8-bit two's-complement mantissa, 9 bytes per block. A value x becomes
m = floor(x * 2^(133 - e_max)) — mantissas truncate toward -inf, and a value far below the block's
maximum becomes 0 (positive) or -1 LSB (negative, even -0.0). Decoding is m * 2^(e_max - 133). This is the
encoding of mlir-aie's block-datatype helpers (see hw SRC_BFP), written here independently.

Weights: symmetric per-group quantization along the last axis (K of a Linear weight [N, K]):
scale = max|w| / qmax per group of `group_size` values, q = round-half-even(w / scale). int4
values pack two per byte, element 2i in the low nibble and 2i+1 in the high nibble. Scales are
bf16 (what the array reads).

MXFP4 (the OCP MX format gpt-oss checkpoints store their experts in, transformers'
integrations/mxfp4.py): 4-bit E2M1 codes (sign bit 3, magnitude index 0-2 into
{0, 0.5, 1, 1.5, 2, 3, 4, 6}), two per byte, element 2i in the low nibble (as int4 packs), and one
uint8 E8M0 scale per 32 values along K, value 2^(scale - 127): 4.25 bits per weight. Decoding is
exact in fp32 and in bf16 (a code has one mantissa bit). Encoding (ours: round to nearest E2M1,
ties to even codes, the scale the smallest power of two putting the block's max|w| within 6)
re-encodes any decoded MXFP4 block to the same values.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.numerics import flush_subnormals

BFP_BLOCK = 8
BFP_BLOCK_BYTES = 9
_BFP_BIAS = 127 + 6          # 2^(e-127) / 64: mantissa LSB of a block with exponent e
INT8_QMAX = 127
INT4_QMAX = 7


# --- bfp16 -----------------------------------------------------------------------------------
def bfp16_nbytes(n: int) -> int:
    """Bytes of n values in bfp16 (padded to whole blocks)."""
    return -(-n // BFP_BLOCK) * BFP_BLOCK_BYTES


def _blocks(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % BFP_BLOCK:
        raise ValueError(f"bfp16: last axis {x.shape[-1]} is not a multiple of {BFP_BLOCK}; "
                         "pad it (quantize_bfp16 pads with zeros)")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("bfp16: inputs must be finite (inf/NaN have no block encoding)")
    return x.reshape(*x.shape[:-1], x.shape[-1] // BFP_BLOCK, BFP_BLOCK)


def _bfp16_fields(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(shared exponents [..., nb] int32, mantissas [..., nb, 8] int32) of fp32 values."""
    blk = _blocks(flush_subnormals(x.float()))
    exp = (blk.contiguous().view(torch.int32) >> 23) & 0xFF
    emax = exp.amax(dim=-1)
    scale = torch.pow(2.0, (_BFP_BIAS - emax).double()).unsqueeze(-1)
    mant = torch.floor(blk.double() * scale).clamp(-128, 127).to(torch.int32)
    # the hardware shifts a negative mantissa (even -0.0) right by >= 32 binades to -1 LSB
    far_neg = torch.signbit(blk) & ((emax.unsqueeze(-1) - exp) >= 32)
    return emax, torch.where(far_neg, torch.full_like(mant, -1), mant)


def encode_bfp16(x: torch.Tensor) -> torch.Tensor:
    """fp32 [..., n] (n % 8 == 0) -> uint8 [..., n // 8 * 9]: per block [exponent, m0..m7]."""
    emax, mant = _bfp16_fields(x)
    out = torch.empty(*emax.shape, BFP_BLOCK_BYTES, dtype=torch.uint8)
    out[..., 0] = emax.to(torch.uint8)
    out[..., 1:] = mant.to(torch.int8).view(torch.uint8)
    return out.reshape(*emax.shape[:-1], emax.shape[-1] * BFP_BLOCK_BYTES)


def decode_bfp16(b: torch.Tensor) -> torch.Tensor:
    """uint8 [..., nb * 9] -> fp32 [..., nb * 8]; exact."""
    if b.shape[-1] % BFP_BLOCK_BYTES:
        raise ValueError(f"bfp16: last axis {b.shape[-1]} is not a multiple of {BFP_BLOCK_BYTES}")
    blk = b.reshape(*b.shape[:-1], b.shape[-1] // BFP_BLOCK_BYTES, BFP_BLOCK_BYTES)
    exp = blk[..., :1].to(torch.int32)
    mant = blk[..., 1:].contiguous().view(torch.int8).double()
    vals = mant * torch.pow(2.0, (exp - _BFP_BIAS).double())
    return vals.float().reshape(*b.shape[:-1], -1)


def quantize_bfp16(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """What the array computes with for a float tensor in bfp16, blocks of 8 along `dim` (fp32).

    The axis is zero-padded to a whole block (zeros never change a block's exponent)."""
    xt = x.float().movedim(dim, -1)
    n = xt.shape[-1]
    pad = (-n) % BFP_BLOCK
    if pad:
        xt = torch.nn.functional.pad(xt, (0, pad))
    emax, mant = _bfp16_fields(xt)
    vals = mant.double() * torch.pow(2.0, (emax - _BFP_BIAS).double()).unsqueeze(-1)
    q = vals.float().reshape(xt.shape)[..., :n]
    return q.movedim(-1, dim)


# --- int8 / int4 weights with group scales ----------------------------------------------------
def _group_view(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, int]:
    cols = w.shape[-1]
    g = cols if group_size <= 0 else group_size
    if cols % g:
        raise ValueError(f"quantize: last axis {cols} is not a multiple of group_size {g}; "
                         f"use a group size that divides it (or 0 for one group per row)")
    return w.float().reshape(*w.shape[:-1], cols // g, g), g


def _quantize(w: torch.Tensor, group_size: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    grouped, _ = _group_view(w, group_size)
    amax = grouped.abs().amax(dim=-1, keepdim=True)
    scale = (amax / qmax).to(torch.bfloat16)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale).float()
    q = torch.round(grouped / safe).clamp(-qmax - 1, qmax).to(torch.int8)
    return q.reshape(w.shape), scale.squeeze(-1)


def quantize_int8(w: torch.Tensor, group_size: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] -> (q int8 [..., K], scales bf16 [..., K // group_size]); 0 = one group per row."""
    return _quantize(w, group_size, INT8_QMAX)


def quantize_int4(w: torch.Tensor, group_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] (K even) -> (packed uint8 [..., K // 2], scales bf16 [..., K // group_size])."""
    if w.shape[-1] % 2:
        raise ValueError(f"quantize_int4: last axis {w.shape[-1]} must be even to pack two per byte")
    q, scales = _quantize(w, group_size, INT4_QMAX)
    return pack_int4(q), scales


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int values in [-8, 7], [..., K] -> uint8 [..., K // 2] (low nibble first)."""
    lo = q[..., 0::2].to(torch.int32) & 0xF
    hi = q[..., 1::2].to(torch.int32) & 0xF
    return (lo | (hi << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K // 2] -> int8 [..., K] with sign extension."""
    p = packed.to(torch.int32)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    both = torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    return torch.where(both >= 8, both - 16, both).to(torch.int8)


def dequantize(q: torch.Tensor, scales: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    """int8 values [..., K] and scales [..., K // g] -> fp32 [..., K] (exact products)."""
    cols = q.shape[-1]
    g = cols if group_size <= 0 else group_size
    grouped = q.float().reshape(*q.shape[:-1], cols // g, g)
    return (grouped * scales.float().reshape(*q.shape[:-1], cols // g, 1)).reshape(q.shape)


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, group_size: int = 0) -> torch.Tensor:
    return dequantize(q, scales, group_size)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, group_size: int = 32) -> torch.Tensor:
    return dequantize(unpack_int4(packed), scales, group_size)


# --- MXFP4 (E2M1 values, an E8M0 scale per 32) -------------------------------------------------
MXFP4_BLOCK = 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_LUT = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float32)
_E8M0_BIAS = 127
_E2M1_MIDPOINTS = torch.tensor([(a + b) / 2 for a, b in zip(E2M1_VALUES, E2M1_VALUES[1:])])


def mxfp4_nbytes(n: int, k: int) -> int:
    """Bytes of an [N, K] weight in MXFP4: K/2 code bytes and K/32 scale bytes per row."""
    return n * (k // 2 + k // MXFP4_BLOCK)


def decode_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., K // 2] and uint8 E8M0 scales [..., K // 32] -> fp32 [..., K] (exact;
    transformers' convert_moe_packed_tensors computes the same values)."""
    b = blocks.to(torch.int64)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(*blocks.shape[:-1], blocks.shape[-1] * 2)
    vals = _E2M1_LUT[codes]
    k = vals.shape[-1]
    if scales.shape[-1] * MXFP4_BLOCK != k:
        raise ValueError(f"mxfp4: {k} values need {k // MXFP4_BLOCK} scales per row, got "
                         f"{scales.shape[-1]}")
    exp = scales.to(torch.int32) - _E8M0_BIAS
    grouped = vals.reshape(*vals.shape[:-1], k // MXFP4_BLOCK, MXFP4_BLOCK)
    return torch.ldexp(grouped, exp.unsqueeze(-1).float()).reshape(vals.shape)


def encode_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [..., K] (K % 32 == 0) -> (codes uint8 [..., K // 2], E8M0 scales uint8 [..., K // 32]):
    round to nearest E2M1 (ties to the even code), scale 2^e with e the smallest exponent for
    which max|w| / 2^e <= 6 (clamped to E8M0's range; an all-zero block gets 2^-127)."""
    k = w.shape[-1]
    if k % MXFP4_BLOCK:
        raise ValueError(f"mxfp4: last axis {k} is not a multiple of {MXFP4_BLOCK}")
    g = w.float().reshape(*w.shape[:-1], k // MXFP4_BLOCK, MXFP4_BLOCK)
    amax = g.abs().amax(-1)
    m, e2 = torch.frexp(amax / 6.0)                   # amax/6 = m 2^e2, m in [0.5, 1)
    e = torch.where(amax > 0, e2 - (m == 0.5).int(), torch.full_like(e2, -_E8M0_BIAS))
    e = e.clamp(-_E8M0_BIAS, 127)
    x = torch.ldexp(g, -e.unsqueeze(-1).float())
    mag = x.abs()
    # nearest grid value: count the midpoints below |x|; on a midpoint take the even code
    idx = torch.bucketize(mag, _E2M1_MIDPOINTS)
    on_mid = (mag == _E2M1_MIDPOINTS[idx.clamp(max=len(E2M1_VALUES) - 2)]) & (idx % 2 == 1)
    idx = idx + on_mid.long()
    codes = (idx | torch.where(torch.signbit(x) & (idx > 0), 8, 0)).reshape(w.shape)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return packed, (e + _E8M0_BIAS).to(torch.uint8)
