"""The simulator's host fast path for encoder blocks keeps the NPU numerics: in-place epilogues,
a single rounding of Q/K/V and the threshold flush of softmax probabilities give the same values
bit for bit as the plain reference ops, and the block GEMMs (bf16 operands held in fp32, fp32
accumulation) agree with torch's CPU bf16 matmul (which accumulates in fp32) within one bf16 ulp
of its rounded output, and with an fp64 product of the same operands within the fp32
accumulation bound K * 2^-23 * sum|x||w|."""
from __future__ import annotations

import math

import pytest
import torch

from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue, apply_epilogue_
from torch_xdna.kernels.attention import attention_reference
from torch_xdna.kernels.encoder_blocks import EncoderAttentionDesign, linear_rows


@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh"])
def test_inplace_epilogue_is_bit_identical(act):
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)) * 4
    assert torch.equal(apply_epilogue_(act, x.clone()), apply_epilogue(act, x))


def test_operand_nonneg_matches_operand_with_subnormals():
    p = torch.softmax(torch.randn(8, 300) * 40, dim=-1)       # exp underflows into subnormals
    p[0, :4] = torch.tensor([0.0, 2.0 ** -127, 2.0 ** -126, 2.0 ** -130])
    assert bool(((p > 0) & (p < numerics.FP32_MIN_NORMAL)).any())
    got, want = numerics.operand_nonneg(p), numerics.operand(p)
    assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())


def test_rounded_attention_equals_reference():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=g) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., 11:] = float("-inf")
    want = attention_reference(q, k, v, scale=0.17, mask=mask)
    ops = [numerics.operand(t) for t in (q, k, v)]
    assert torch.equal(attention_reference(*ops, scale=0.17, mask=mask, rounded=True), want)


def test_block_gemm_matches_cpu_bf16_matmul_within_accumulation_bound():
    g = torch.Generator().manual_seed(3)
    rows, k, n, chunk = 48, 384, 160, 16
    x = torch.randn(rows, k, generator=g)
    w = (torch.randn(k, n, generator=g) / math.sqrt(k)).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    got = linear_rows(x, w, b, chunk=chunk)
    xo, wo, bo = numerics.operand(x), w.float(), b.float()
    exact = xo.double() @ wo.double() + bo.double()
    bound = k * 2.0 ** -23 * (xo.abs().double() @ wo.abs().double() + bo.abs().double())
    assert bool(((got.double() - exact).abs() <= bound).all())
    # torch's CPU bf16 GEMM: bf16 operands, fp32 accumulation, result rounded to bf16
    # (no bias: its output is rounded before any bias could be added); within one bf16 ulp
    cpu = torch.matmul(xo.bfloat16(), w).float()
    mine = linear_rows(x, w, torch.zeros(n, dtype=torch.bfloat16), chunk=chunk)
    ulp = torch.finfo(torch.bfloat16).eps * cpu.abs()
    assert bool(((mine - cpu).abs() <= ulp).all())
    # each chunk is its own GEMM: a row's result does not depend on the other rows
    assert torch.equal(linear_rows(x[:chunk], w, b, chunk=chunk), got[:chunk])


def test_encoder_attention_block_matches_unfused_reference():
    b, s, h, nh = 2, 16, 64, 4
    g = torch.Generator().manual_seed(4)
    x = torch.randn(b * s, h, generator=g)
    w_qkv = (torch.randn(h, 3 * h, generator=g) / 8).bfloat16()
    b_qkv = torch.randn(3 * h, generator=g).bfloat16() * 0.1
    w_o = (torch.randn(h, h, generator=g) / 8).bfloat16()
    b_o, ln_w, ln_b = (torch.randn(h, generator=g).bfloat16() * 0.1 for _ in range(3))
    mask = torch.zeros(b, s)
    mask[1, 9:] = float("-inf")
    out = torch.empty(b * s, h)
    d = EncoderAttentionDesign(b, s, h, nh, 1e-12)
    d.reference([x, w_qkv, b_qkv, mask, w_o, b_o, ln_w, ln_b], [out])
    # the same steps with the plain ops (operands rounded per head view, new tensors each step)
    xo = numerics.operand(x)
    qkv = xo.view(b, s, h).matmul(w_qkv.float()).view(b * s, -1) + b_qkv.float()
    q, kk, v = qkv.view(b, s, 3, nh, h // nh).permute(2, 0, 3, 1, 4)
    ctx = attention_reference(q, kk, v, scale=1 / math.sqrt(h // nh), mask=mask.view(b, 1, 1, s))
    y = numerics.operand(ctx.permute(0, 2, 1, 3).reshape(b * s, h)).view(b, s, h).matmul(
        w_o.float()).view(b * s, h) + b_o.float() + x
    ref = torch.nn.functional.layer_norm(numerics.operand(y), (h,), ln_w.float(), ln_b.float(),
                                         1e-12)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_one_gemm_path_only_where_it_gives_the_block_bits():
    from torch_xdna.kernels import encoder_blocks as eb
    g = torch.Generator().manual_seed(5)
    x = numerics.operand(torch.randn(4 * 24, 384, generator=g))
    w = numerics.operand(torch.randn(384, 160, generator=g))
    blocks = torch.bmm(x.view(4, 24, 384), w.expand(4, 384, 160)).view(96, 160)
    eb._ONE_GEMM_OK.pop((96, 24, 384, 160), None)
    first = eb._block_gemm(x, w, 24)                 # checks the shape, returns the block result
    assert torch.equal(first, blocks)
    ok = eb._ONE_GEMM_OK[(96, 24, 384, 160)]
    assert ok == torch.equal(torch.mm(x, w), blocks)
    assert torch.equal(eb._block_gemm(x, w, 24), blocks)   # the cached path: same bits
    assert torch.equal(eb._block_gemm(x[:24], w, 24), blocks[:24])
