"""host_fused: bias + exact GELU + rounding to the next GEMM's operand in one host pass must give
the bits the torch ops give (numerics.gemm_operand(apply_epilogue_(act, acc + b))), including
subnormals, +-0, +-inf and NaN, and the embedder's vectors must not change by a bit."""
from __future__ import annotations

import math

import pytest
import torch

from torch_xdna.kernels import numerics

from torch_xdna.kernels.host import fused as host_fused
from torch_xdna.kernels.activations import apply_epilogue_
from torch_xdna.kernels.blocks.encoder import linear_rows

pytestmark = pytest.mark.skipif(
    not host_fused.available(),
    reason=f"host_fused kernel not built: {host_fused.unavailable_reason()}")

SPECIAL = [0.0, -0.0, 1e-40, -1e-40, 1e-45, -1e-45, 2.0 ** -126, -(2.0 ** -126), 1.1754942e-38,
           float("inf"), -float("inf"), float("nan"), 3.4e38, -3.4e38, 9.0, -9.0, 10.5, 1e-20,
           -5.0, 5.0, 0.5, -0.5, 1e30, -1e30]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality, any NaN equal to any NaN (NaN payloads are not observable downstream)."""
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def _reference(acc: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    return numerics.gemm_operand(apply_epilogue_(act, acc.clone().add_(b)))


def _values(rows: int, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 3
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (rows, n), generator=g, dtype=torch.int32)
    x = torch.where(torch.rand(rows, n, generator=g) < 0.3, bits.view(torch.float32), x)
    tiny = torch.randint(-2 ** 23, 2 ** 23, (rows, n), generator=g, dtype=torch.int32)
    # and subnormals
    x = torch.where(torch.rand(rows, n, generator=g) < 0.1, tiny.view(torch.float32), x)
    flat = x.view(-1)
    flat[:len(SPECIAL)] = torch.tensor(SPECIAL)[:flat.numel()]
    return x


@pytest.mark.parametrize("act", host_fused.ACTS)
@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (17, 1000), (40, 1536), (2, 513)])
def test_fused_pass_is_bit_identical_to_the_torch_ops(act, rows, n):
    acc = _values(rows, n, rows * 1000 + n)
    b = torch.randn(n, generator=torch.Generator().manual_seed(n)).bfloat16().float()
    b[:min(n, 4)] = torch.tensor([0.0, -0.0, float("inf"), 1e-40])[:min(n, 4)]
    assert _same(host_fused.bias_act_operand(acc.clone(), b, act), _reference(acc, b, act))


def test_every_bf16_input_through_gelu():
    """All 65536 bf16 bit patterns as accumulators (every exponent incl. subnormal, inf, NaN)."""
    acc = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    acc = acc.float().view(256, 256)
    for bias in (0.0, 1e-39, -3.0):
        b = torch.full((256,), bias)
        got = host_fused.bias_act_operand(acc.clone(), b, "gelu")
        assert _same(got, _reference(acc, b, "gelu"))


def test_strided_rows_and_threads(monkeypatch):
    acc = _values(64, 300, 7)
    wide = torch.zeros(64, 400)
    wide[:, :300] = acc
    b = torch.randn(300).bfloat16().float()
    ref = _reference(acc, b, "gelu")
    assert _same(host_fused.bias_act_operand(wide[:, :300], b, "gelu"), ref)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _same(host_fused.bias_act_operand(acc.clone(), b, "gelu"), ref)
    finally:
        torch.set_num_threads(n)


def test_vml_erf_is_torch_erf_elementwise():
    """The erf the kernel calls (MKL vmsErf, HA) is torch.erf's, independent of block offsets."""
    import ctypes
    fn = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                          ctypes.c_longlong)(host_fused._state["erf"])
    x = torch.cat([_values(1, 4096, 3).view(-1), torch.tensor(SPECIAL)]) / math.sqrt(2.0)
    y = torch.empty_like(x)
    for off in (0, 1, 5):
        fn(x.numel() - off, x[off:].data_ptr(), y[off:].data_ptr(), host_fused.VML_MODE)
        assert _same(y[off:], torch.erf(x[off:]))


def test_linear_rows_operand_out_matches_rounding_after(monkeypatch):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(37, 64, generator=g)
    w = (torch.randn(64, 256, generator=g) / 8).bfloat16()
    b = torch.randn(256, generator=g).bfloat16()
    for act in ("gelu", "none", "tanh"):
        want = numerics.gemm_operand(linear_rows(x, w, b, act=act))
        assert _same(linear_rows(x, w, b, act=act, operand_out=True), want)
    monkeypatch.setenv("TORCH_XDNA_HOST_KERNELS", "0")
    assert not host_fused.available()
    assert _same(linear_rows(x, w, b, act="gelu", operand_out=True),
                 numerics.gemm_operand(linear_rows(x, w, b, act="gelu")))


def test_embeddings_unchanged_by_the_fused_pass(monkeypatch):
    """The bundled all-MiniLM-L6-v2: vectors with the fused passes == with the torch ops
    (the GEMM held the same: TORCH_XDNA_HOST_KERNELS=0 also drops the packed oneDNN GEMM,
    which sums in another order)."""
    from torch_xdna.engine.embed.embedder import Embedder
    from torch_xdna.kernels.host import gemm as host_gemm
    monkeypatch.setattr(host_gemm, "packing_enabled", lambda: False)
    texts = ["Hello world.", "a", "The NPU streams weights from DRAM; batching amortizes the "
             "dispatch cost.", "Zürich café naïve résumé 東京 " * 6]
    emb = Embedder.load()
    try:
        fused = emb.embed(texts)
        monkeypatch.setenv("TORCH_XDNA_HOST_KERNELS", "0")
        plain = emb.embed(texts)
    finally:
        emb.close()
    assert torch.equal(fused, plain)


def test_probs_operand_is_nan_to_num_then_operand_nonneg():
    """The softmax-probability pass: every fp32 class (NaN, +-inf, subnormals, +-0, negatives,
    values rounding up to a normal, ties) gives the bits of the torch ops it replaces."""
    p = _values(37, 301, 5).abs() * torch.where(torch.rand(37, 301) < 0.1, -1.0, 1.0)
    flat = p.view(-1)
    flat[-8:] = torch.tensor([numerics.BF16_MAX_SUBNORMAL, 1.1754942e-38, 1.1755e-38,
                              float("-inf"), float("nan"), 1.00390625, 1.01171875, 3.4e38])
    want = numerics.operand_nonneg(torch.nan_to_num_(p.clone(), nan=0.0))
    got = host_fused.probs_operand_(p.clone())
    assert _same(got, want) and torch.equal(got.signbit(), want.signbit())
    softmax = torch.softmax(torch.randn(4, 12, 50, 50) * 30, dim=-1)     # underflowing tails
    assert _same(host_fused.probs_operand_(softmax.clone()),
                 numerics.operand_nonneg(torch.nan_to_num_(softmax.clone(), nan=0.0)))


def test_encoder_attention_equals_attention_reference():
    from torch_xdna.kernels.ops.attention import attention_reference
    from torch_xdna.kernels.blocks.encoder import encoder_attention
    g = torch.Generator().manual_seed(8)
    q, k, v = (numerics.operand(torch.randn(12, 3, 37, 32, generator=g) * 2) for _ in range(3))
    assert torch.equal(encoder_attention(q, k, v, 0.17),
                       attention_reference(q, k, v, scale=0.17, rounded=True))


@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (40, 384), (5, 1000)])
def test_bias_residual_operand_is_operand_of_the_sum(rows, n):
    acc, res = _values(rows, n, n + 1), _values(rows, n, n + 2)
    b = _values(1, n, n + 3)[0]
    if n >= 4:                          # signed zeros and subnormal sums keep their sign
        acc[0, :4] = torch.tensor([-0.0, -1e-40, 1e-40, -0.0])
        b[:4] = torch.tensor([-0.0, 0.0, -0.0, 0.0])
        res[0, :4] = torch.tensor([-0.0, -1e-41, 1e-41, -0.0])
    want = numerics.operand(acc.clone().add_(b).add_(res))
    got = host_fused.bias_residual_operand(acc.clone(), b, res)
    assert _same(got, want) and torch.equal(got.signbit(), want.signbit())
    wide = torch.zeros(rows, n + 9)                                     # strided rows
    wide[:, 3:n + 3] = acc
    assert _same(host_fused.bias_residual_operand(wide[:, 3:n + 3], b, res), want)


def test_linear_residual_layer_norm_equals_linear_then_norm():
    from torch_xdna.kernels.blocks.encoder import (layer_norm_design, linear_residual_layer_norm,
                                                   linear_rows)
    g = torch.Generator().manual_seed(12)
    x = numerics.operand(torch.randn(50, 384, generator=g))
    w = (torch.randn(384, 384, generator=g) / 20).bfloat16()
    b, ln_w, ln_b = (torch.randn(384, generator=g).bfloat16() for _ in range(3))
    res = torch.randn(50, 384, generator=g) * 3
    ln = layer_norm_design(50, 384, 1e-12)
    want = torch.empty(50, 384)
    ln.reference([linear_rows(x, w, b, residual=res, rounded=True), ln_w, ln_b], [want])
    assert torch.equal(linear_residual_layer_norm(x, w, b, res, ln, ln_w, ln_b), want)


@pytest.mark.parametrize("rows,n", [(1, 1), (17, 384), (3, 5000)])
def test_gemm_operand_pass_is_numerics_gemm_operand(rows, n):
    x = _values(rows, n, n + 7)
    assert _same(host_fused.gemm_operand(x), numerics.gemm_operand(x))
    wide = torch.zeros(rows, n + 5)
    wide[:, 2:n + 2] = x
    assert _same(host_fused.gemm_operand(wide[:, 2:n + 2]), numerics.gemm_operand(x))


@pytest.mark.parametrize("rows,n,d", [(1, 6, 2), (37, 1152, 32), (5, 96, 16)])
def test_bias_operand_heads_is_the_pass_then_the_permute(rows, n, d):
    acc = _values(rows, n, n + d)
    b = torch.randn(n, generator=torch.Generator().manual_seed(d)).bfloat16().float()
    want = _reference(acc, b, "none").view(rows, n // d, d).permute(1, 0, 2)
    assert _same(host_fused.bias_operand_heads(acc.clone(), b, d), want.contiguous())
    n_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _same(host_fused.bias_operand_heads(acc.clone(), b, d), want.contiguous())
    finally:
        torch.set_num_threads(n_threads)
