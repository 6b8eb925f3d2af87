"""Numerics modes: bfp16 blocks bit for bit, bf16 rounding modes, int8/int4 group quantization,
subnormal flush-to-zero, precision plans, and GemmDesign honoring them."""
from __future__ import annotations

import struct

import pytest
import torch

from torch_xdna.kernels import numerics, quant
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.numerics_plan import Numerics, NumericsPlan


# --- a bit-level bfp16 reference in plain Python integers (the hardware's recipe, step by step) --
def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bfp16_block_reference(vals: list[float]) -> list[int]:
    """[exponent, m0..m7] as bytes: each mantissa is the top 8 bits of the signed 24-bit
    significand at its own exponent, then arithmetically shifted down to the block's exponent."""
    assert len(vals) == 8
    bits = [_f32_bits(v) for v in vals]
    exps = [(b >> 23) & 0xFF for b in bits]
    emax = max(exps)
    out = [emax]
    for b, e in zip(bits, exps):
        sign = b >> 31
        mant = (b & 0x7FFFFF) | (0x800000 if e else 0)
        m32 = ((-mant) & 0xFFFFFFFF) if sign else mant       # two's complement in 32 bits
        v = (m32 >> 17) & 0xFF                               # logical shift, low byte
        v = v - 256 if v >= 128 else v                       # as int8
        shift = emax - e
        v = (-1 if sign else 0) if shift >= 32 else v >> shift   # Python >> is arithmetic
        out.append(v & 0xFF)
    return out


HAND_BLOCKS = {
    "shared exponent": [1.0, 0.5, 0.25, 3.0, -2.0, 0.125, 1.5, -0.75],
    "all zeros": [0.0] * 8,
    "negatives truncate down": [-1.0, -0.3, -0.01, -1e-3, -1.9, -0.5, -0.0, -7.0],
    "saturating max": [1.9999999, -1.9999999, 0.0, 1.0, -1.0, 0.9999, 1.9921875, -1.9921875],
    "far below max": [1e20, 1e-20, -1e-20, 3.0, -3.0, 1.0, 0.0, 1e19],
    "mixed small": [3e-5, -2e-6, 7e-7, 1e-4, -1e-4, 5e-5, 0.0, 2.5e-5],
    "exact powers": [64.0, 32.0, -64.0, 1.0, 0.5, -0.5, 2.0, 96.0],
}


@pytest.mark.parametrize("name", sorted(HAND_BLOCKS))
def test_bfp16_encode_matches_bit_reference(name):
    vals = HAND_BLOCKS[name]
    got = quant.encode_bfp16(torch.tensor(vals, dtype=torch.float32)).tolist()
    assert got == bfp16_block_reference(vals), name


def test_bfp16_decode_and_properties():
    x = torch.tensor(HAND_BLOCKS["shared exponent"])
    q = quant.quantize_bfp16(x)
    assert torch.equal(quant.decode_bfp16(quant.encode_bfp16(x)), q)
    # block max 3.0 -> exponent of 2^1, LSB = 2^(1-6) = 1/32: values are multiples of 1/32
    assert torch.equal(q * 32, torch.floor(q * 32))
    assert torch.equal(q, torch.floor(x * 32) / 32)          # truncation toward -inf
    assert quant.encode_bfp16(x)[0].item() == 128             # biased exponent of 3.0
    neg = quant.quantize_bfp16(torch.tensor(HAND_BLOCKS["negatives truncate down"]))
    assert (neg <= torch.tensor(HAND_BLOCKS["negatives truncate down"])).all()
    sat = quant.encode_bfp16(torch.tensor(HAND_BLOCKS["saturating max"]))
    assert sat[1:].view(torch.int8).tolist()[:2] == [127, -128]   # never wraps
    far = quant.quantize_bfp16(torch.tensor(HAND_BLOCKS["far below max"]))
    assert far[1].item() == 0.0 and far[2].item() < 0            # 0 and -1 LSB
    assert quant.bfp16_nbytes(16) == 18 and quant.bfp16_nbytes(9) == 18


def test_bfp16_random_blocks_and_axis():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 37, generator=g) * torch.logspace(-3, 3, 37)
    ref = torch.tensor([bfp16_block_reference(x[r, c:c + 8].tolist() + [0.0] * (8 - len(x[r, c:c + 8])))
                        for r in range(4) for c in range(0, 37, 8)], dtype=torch.uint8)
    padded = torch.nn.functional.pad(x, (0, 3))
    assert torch.equal(quant.encode_bfp16(padded).view(-1, 9), ref)
    q = quant.quantize_bfp16(x)
    rel = ((q - x).abs() / x.abs().amax()).max()
    assert rel < 2 ** -5
    # blocks along another axis == transpose, quantize, transpose back
    assert torch.equal(quant.quantize_bfp16(x.t().contiguous(), dim=0), q.t())
    with pytest.raises(ValueError, match="finite"):
        quant.encode_bfp16(torch.tensor([float("inf")] + [0.0] * 7))


def test_bf16_rounding_modes_bit_exact():
    # 1 + 2^-8 + 2^-9 etc: exactly at and around bf16 half-ulps
    cases = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20,
                          -(1.0 + 2 ** -8), -(1.0 + 2 ** -20), 3.0, -3.0, 0.0, 1e-3, -1e-3],
                         dtype=torch.float32)
    bits = cases.view(torch.int32)
    rne = numerics.bf16_round(cases, "rne").view(torch.int32)
    floor = numerics.bf16_round(cases, "floor").view(torch.int32)
    for x, b, r, f in zip(cases.tolist(), bits.tolist(), rne.tolist(), floor.tolist()):
        lo, keep = b & 0xFFFF, b & ~0xFFFF
        half = 0x8000
        up = lo > half or (lo == half and (keep >> 16) & 1)
        assert r == (keep + 0x10000 if up else keep), x            # RNE on the magnitude
        assert f == (keep + 0x10000 if (x < 0 and lo) else keep), x  # toward -inf
        assert numerics.bf16_round(torch.tensor([x]), "floor").item() <= x
    with pytest.raises(ValueError, match="rounding"):
        numerics.bf16_round(cases, "up")


def test_subnormals_flush_to_zero():
    x = torch.tensor([1e-39, -1e-39, 2.0 ** -126, 1.0, 0.0])
    y = numerics.flush_subnormals(x)
    assert y.tolist()[:2] == [0.0, 0.0] and torch.signbit(y[1])
    assert y[2].item() == 2.0 ** -126 and y[3].item() == 1.0
    assert numerics.operand(x)[0].item() == 0.0
    assert numerics.operand(x, ftz=False)[0].item() != 0.0


@pytest.mark.parametrize("bits,qmax", [(8, 127), (4, 7)])
@pytest.mark.parametrize("group", [0, 32, 64])
def test_group_quant_error_bounds(bits, qmax, group):
    g = torch.Generator().manual_seed(bits + group)
    w = torch.randn(16, 128, generator=g) * torch.linspace(0.01, 3, 128)
    if bits == 8:
        q, s = quant.quantize_int8(w, group)
        deq = quant.dequantize_int8(q, s, group)
        assert q.dtype == torch.int8 and int(q.abs().max()) <= 128
    else:
        packed, s = quant.quantize_int4(w, group)
        assert packed.dtype == torch.uint8 and packed.shape == (16, 64)
        deq = quant.dequantize_int4(packed, s, group)
        assert int(quant.unpack_int4(packed).abs().max()) <= 8
    gs = group or 128
    assert s.shape == (16, 128 // gs) and s.dtype == torch.bfloat16
    # error per element: half a step, plus the bf16 rounding of the scale (|q| <= qmax steps)
    step = s.float().repeat_interleave(gs, dim=1)
    bound = 0.5 * step + qmax * step * 2 ** -8 + 1e-7
    assert ((deq - w).abs() <= bound).all()


def test_int4_pack_roundtrip():
    q = torch.tensor([[-8, 7, 0, -1, 3, -3]], dtype=torch.int8)
    packed = quant.pack_int4(q)
    assert packed.tolist() == [[0x78, 0xF0, 0xD3]]
    assert torch.equal(quant.unpack_int4(packed), q)


def test_precision_plan_resolution():
    plan = NumericsPlan.parse("layers.*.mlp*=int4:g32, lm_head=int8, attention=bf16:floor, "
                               "default=bfp16")
    assert plan.resolve("layers.3.mlp.up") == Numerics("int4", group_size=32)
    assert plan.resolve("lm_head").dtype == "int8"
    assert plan.resolve(kind="attention").rounding == "floor"
    assert plan.resolve("layers.3.attn.q").dtype == "bfp16"
    assert plan.resolve("layers.3.mlp.up").gemm_fields(1024) == {
        "dtype": "int4", "rounding": "rne", "w_group": 32}
    assert plan.resolve("lm_head").gemm_fields(512)["w_group"] == 512
    assert NumericsPlan.parse(str(plan)) == plan
    with pytest.raises(ValueError, match="unknown numerics"):
        Numerics("fp8")


def _run(design, inputs, shape):
    out = torch.empty(shape)
    design.reference(inputs, [out])
    return out


def test_gemm_reference_honors_numerics():
    g = torch.Generator().manual_seed(1)
    m, k, n = 8, 64, 16
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    exact = a @ b
    base = _run(GemmDesign(m, k, n), [a, b], (m, n))               # default stays bf16 RNE
    ref = numerics.bf16_round(a) @ numerics.bf16_round(b)
    torch.testing.assert_close(base, ref, rtol=1e-5, atol=1e-5)
    floor = _run(GemmDesign(m, k, n, rounding="floor"), [a, b], (m, n))
    ref_f = numerics.bf16_round(a, "floor") @ numerics.bf16_round(b, "floor")
    torch.testing.assert_close(floor, ref_f, rtol=1e-5, atol=1e-5)
    bfp = _run(GemmDesign(m, k, n, dtype="bfp16"), [a, b], (m, n))
    ref_b = quant.quantize_bfp16(numerics.bf16_round(a), -1) @ \
        quant.quantize_bfp16(numerics.bf16_round(b), -2)
    torch.testing.assert_close(bfp, ref_b, rtol=1e-5, atol=1e-5)
    assert (bfp - exact).abs().max() < 0.25 * exact.abs().max()
    # weight-only int4 / int8: W [N, K] with group scales
    w = b.t().contiguous()
    packed, s4 = quant.quantize_int4(w, 32)
    y4 = _run(GemmDesign(m, k, n, dtype="int4", w_group=32), [a, packed, s4], (m, n))
    w4 = numerics.bf16_round(quant.dequantize_int4(packed, s4, 32))
    torch.testing.assert_close(y4, numerics.bf16_round(a) @ w4.t(), rtol=1e-5, atol=1e-5)
    q8, s8 = quant.quantize_int8(w, 16)
    y8 = _run(GemmDesign(m, k, n, dtype="int8", w_group=16, bias=True),
              [a, q8, s8, torch.ones(n)], (m, n))
    w8 = numerics.bf16_round(quant.dequantize_int8(q8, s8, 16))
    torch.testing.assert_close(y8, numerics.bf16_round(a) @ w8.t() + 1, rtol=1e-5, atol=1e-5)
    assert (y8 - 1 - exact).abs().max() < 0.05 * exact.abs().max()
    # int8 x int8 (w_group 0) keeps integer accumulation
    ai = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    bi = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
    out = torch.empty(m, n, dtype=torch.int32)
    GemmDesign(m, k, n, dtype="int8", out_dtype=torch.int32).reference([ai, bi], [out])
    assert torch.equal(out, ai.int() @ bi.int())
    with pytest.raises(ValueError, match="w_group"):
        GemmDesign(m, k, n, dtype="bf16", w_group=32)
