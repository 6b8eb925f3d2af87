"""Decode host-speed paths that must not change numerics: the attention block's fp32 KV mirror
(kernels/blocks/llm.py KV_MIRROR), the one-pass C operand rounding (host_gemv.operand) and the C
RMSNorm tail (host_gemv.rms_norm; both switched by host_gemv.FAST_OPERAND). Decode
logits are torch.equal with and without them on the test models (tests/llm_fixtures.py; gemma3's
sliding window exercises a window start past 0), across a reset and a cache written behind its
back, and greedy tokens still equal transformers'. The C decode attention kernel
(host_attention) is off in both runs here: it differs from the torch reference in fp32 summation
order, which tests/test_host_attention.py bounds."""
from __future__ import annotations

import pytest
import torch

from torch_xdna.kernels import numerics

from torch_xdna.kernels.host import attention as host_attention

from torch_xdna.kernels.host import gemv as host_gemv

from torch_xdna.kernels.blocks import operands, toolkit

PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]


@pytest.fixture(scope="module", params=("qwen3", "llama", "gemma3"))
def tiny_model(request, tmp_path_factory):
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp(request.param)
    model = build_model(request.param, path)
    return request.param, path, model


def _logits(path, mirror: bool, monkeypatch) -> tuple[list[int], list[torch.Tensor]]:
    from torch_xdna.engine.llm.generate import load_decoder
    monkeypatch.setattr(operands.KV_MIRROR, "enabled", mirror)
    monkeypatch.setattr(host_gemv, "FAST_OPERAND", mirror)
    monkeypatch.setattr(host_attention, "ENABLED", False)      # bit-equality: torch attention
    eng = load_decoder(path, "bf16", max_context=96, prefill_chunk=8, quiet=True, cache_dir=False)
    try:
        dec = eng.decoder
        out, toks = [], []
        for _ in range(2):                      # the second pass runs after a reset
            dec.reset()
            lg = dec.forward(PROMPT)
            out.append(lg)
            toks = [int(lg.argmax())]
            for _ in range(20):                 # positions 12..31: past a 16-key tile
                lg = dec.forward([toks[-1]])
                out.append(lg)
                toks.append(int(lg.argmax()))
        # a cache written behind the mirror's back (another writer): rebuilt, not trusted
        k0 = dec.cache.k[0]
        dec.dev.write(k0.buffer, dec.dev.download(k0))
        out.append(dec.forward([toks[-1]]))
        assert bool(operands.KV_MIRROR.entries) == mirror     # the mirror path was taken
    finally:
        eng.close()
    return toks, out


def test_decode_logits_equal_with_and_without_mirror(tiny_model, monkeypatch):
    fam, path, model = tiny_model
    toks0, base = _logits(path, False, monkeypatch)
    toks1, got = _logits(path, True, monkeypatch)
    assert toks1 == toks0, fam
    assert len(got) == len(base)
    for i, (a, b) in enumerate(zip(got, base)):
        assert torch.equal(a, b), f"{fam}: logits differ at step {i}"
    from llm_fixtures import hf_greedy
    hf = hf_greedy(model, PROMPT, 8)
    assert toks1[:8] == hf, fam


def test_mirror_follows_the_cache():
    m = operands.KvMirror()
    cache = torch.zeros(2, 40, 4, dtype=torch.bfloat16)
    ver = cache._version
    cache[:, :5] = torch.randn(2, 5, 4).bfloat16()
    r = m.rows(cache, ver, 0, 5, 0, 16)
    assert r.shape == (2, 16, 4) and torch.equal(r[:, :5], cache[:, :5].float())
    assert not r[:, 5:].any()
    ver = cache._version
    cache[:, 5:7] = 1.5
    r = m.rows(cache, ver, 5, 7, 0, 16)
    assert torch.equal(r[:, :7], cache[:, :7].float()) and not r[:, 7:].any()
    cache[:, 0] = -2.0                               # written by someone else: rebuilt
    ver = cache._version
    r = m.rows(cache, ver, 7, 7, 0, 16)
    assert torch.equal(r[:, :7], cache[:, :7].float())
    ver = cache._version                             # a reset to position 2: rows past it zeroed
    cache[:, 2] = 3.0
    r = m.rows(cache, ver, 2, 3, 0, 16)
    assert torch.equal(r[:, :3], cache[:, :3].float()) and not r[:, 3:].any()
    ver = cache._version                             # grows up to the capacity (rounded to tkv)
    cache[:, 3:35] = 0.25
    r = m.rows(cache, ver, 3, 35, 16, 16)
    assert r.shape == (2, 32, 4) and torch.equal(r[:, :19], cache[:, 16:35].float())


@pytest.mark.skipif(not host_gemv.available(), reason="host kernel not built")
def test_c_operand_bit_equal_to_numerics_operand():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int64)
    edge = torch.tensor([0.0, -0.0, 1e-40, -1e-40, 1.1754942e-38, -1.1754942e-38, 1.17549435e-38,
                         float("inf"), -float("inf"), 3.4e38, -3.4e38, 3.3961e38, 1.00390625,
                         1.005859375, 1.0029296875, -1.0029296875, float("nan")])
    x = torch.cat([bits.to(torch.int32).view(torch.float32), edge])
    a, r = host_gemv.operand(x), numerics.operand(x)
    nan = torch.isnan(r)
    assert torch.equal(torch.isnan(a), nan)
    assert torch.equal(a[~nan].view(torch.int32), r[~nan].view(torch.int32))
    y = torch.randn(4, 6)[:, :3]                        # not contiguous: numerics.operand
    assert torch.equal(host_gemv.operand(y), numerics.operand(y))


def _rms_torch(x, w, eps, offset, round_out):
    y = x * (x * x).mean(-1, keepdim=True).add_(toolkit.scalar(eps)).rsqrt_()
    y = y * (w + toolkit.scalar(offset)) if offset else y * w
    return numerics.operand(y) if round_out else y


@pytest.mark.skipif(not host_gemv.available(), reason="host kernel not built")
@pytest.mark.parametrize("shape,wshape", [((1, 1024), (1024,)), ((3, 1152), (1152,)),
                                          ((1, 24, 128), (24, 128)), ((2, 6, 256), (6, 256)),
                                          ((1, 3, 16), (16,)), ((5, 64), (64,))])
def test_c_rms_norm_bit_equal_to_the_torch_ops(shape, wshape):
    """host_gemv.rms_norm (torch's sum of squares, the rest in C) = toolkit.rms_norm's torch ops
    bit for bit: random scales over 2^-60..2^60, a zero row, bf16 ties, offsets 0 and 1,
    rounded and unrounded output."""
    g = torch.Generator().manual_seed(sum(shape))
    for trial in range(40):
        scale = 2.0 ** float(torch.randint(-60, 61, (1,), generator=g))
        x = numerics.operand(torch.randn(*shape, generator=g) * scale)
        if trial == 0:
            x.view(-1, shape[-1])[0] = 0.0                      # ss = 0: 1 / sqrt(eps)
        if trial == 1:
            x.view(-1)[:4] = torch.tensor([1.00390625, 1.005859375, -1.0029296875, 3.3e38])
        w = numerics.operand(torch.randn(*wshape, generator=g))
        for eps, off, rnd_out in ((1e-6, 0.0, False), (1e-5, 1.0, True), (1e-6, 0.0, True)):
            got = host_gemv.rms_norm(x, w, eps, off, rnd_out)
            want = _rms_torch(x, w, eps, off, rnd_out)
            assert got is not None
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (shape, trial, eps, off)
    assert host_gemv.rms_norm(x.transpose(0, -1), w, 1e-6, 0.0, False) is None   # layout: torch


@pytest.mark.skipif(not host_gemv.available(), reason="host kernel not built")
@pytest.mark.parametrize("n,h,d", [(1, 24, 128), (3, 5, 16), (1, 2, 256), (2, 3, 7)])
def test_c_rope_bit_equal_to_the_torch_ops(n, h, d):
    """host_gemv.rope = operand(toolkit.rope(...)) bit for bit (random operands over wide
    scales, bf16 ties in the sum, an odd head_dim's roll)."""
    g = torch.Generator().manual_seed(n * h * d)
    for trial in range(30):
        scale = 2.0 ** float(torch.randint(-40, 41, (1,), generator=g))
        x = numerics.operand(torch.randn(n, h, d, generator=g) * scale)
        cos = numerics.operand(torch.rand(n, 1, d, generator=g) * 2 - 1)
        ssin = numerics.operand(torch.rand(n, 1, d, generator=g) * 2 - 1)
        if trial == 0:
            x.view(-1)[:3] = torch.tensor([1.00390625, 1.005859375, -3.3e38])
            cos.view(-1)[:3], ssin.view(-1)[:3] = 1.0, 0.0
        got = host_gemv.rope(x, cos, ssin)
        want = numerics.operand(toolkit.rope(x, cos, ssin))
        assert got is not None
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)), (n, h, d)
    assert host_gemv.rope(x.transpose(0, 1), cos, ssin) is None          # layout: torch
