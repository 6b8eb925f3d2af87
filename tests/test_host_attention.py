"""The decode attention host kernel (kernels/host/attention.py) against the torch reference it
replaces, attention.flash_attention (and the literal tile loop flash_attention_loop).

Bounds. The kernel computes the same closed form with the same exp (torch's, checked bit for bit
at build time); only fp32 sums are associated differently. (1) When every q . k sum is exact in
fp32 (small dyadic values), the scores, exp(S - m) and the bf16 P are identical, so the results
agree to fp32 summation round-off: |diff| <= 2^-20 * max|V| (a sum of at most ~1000 terms, each
<= |V| / l scaled, u = 2^-24, slack included). (2) Random values: a q . k rounded one ulp apart
(D * 2^-24 * sum|q k|) moves e by an ulp and can flip the bf16 rounding of one P term (2^-8
relative), so |diff| <= 2^-8 * max|V| elementwise, and such flips are rare: the mean |diff| stays
below 2^-16 * max|V|. Edge cases: the first key, a partial last tile, several splits, windows that
leave one key or none (all-masked rows give zeros, as the reference), k_offset past 0.
Engine: greedy tokens equal transformers' on the qwen3 / llama / gemma3 test models with the
kernel on and off, logits within the bf16-flip distance of each other.
"""
from __future__ import annotations

import pytest
import torch

from torch_xdna.kernels import numerics

from torch_xdna.kernels.host import attention as host_attention
from torch_xdna.kernels.ops.attention import flash_attention, flash_attention_loop

pytestmark = pytest.mark.skipif(
    not host_attention.available(),
    reason=f"host attention kernel unavailable: {host_attention.unavailable_reason()}")


def _kv(hkv, s_len, d, tkv, g, dyadic: bool):
    """fp32 tile-padded K/V as the KV mirror holds them (keys past s_len zero)."""
    total = -(-s_len // tkv) * tkv
    k, v = torch.zeros(hkv, total, d), torch.zeros(hkv, total, d)
    if dyadic:
        k[:, :s_len] = torch.randint(-3, 4, (hkv, s_len, d), generator=g).float()
    else:
        k[:, :s_len] = numerics.operand(torch.randn(hkv, s_len, d, generator=g) * 2)
    v[:, :s_len] = numerics.operand(torch.randn(hkv, s_len, d, generator=g))
    return k, v


def _q(hkv, r, d, g, dyadic: bool):
    if dyadic:
        return torch.randint(-2, 3, (hkv, r, d), generator=g).float() * 0.25
    return numerics.operand(torch.randn(hkv, r, d, generator=g) * 2)


# (hkv, rows, head_dim, keys, tkv, k_offset, last query position or None, splits, window)
CASES = [
    (8, 2, 128, 150, 32, 0, None, 4, None),        # Qwen3-0.6B decode shape
    (2, 1, 64, 1, 16, 0, None, 1, None),           # the first key only
    (2, 3, 16, 1000, 32, 64, None, 4, 100),        # window, several splits, k_offset
    (4, 8, 64, 300, 32, 0, None, 1, None),         # 8 rows at 8 positions (prefill-like)
    (2, 2, 16, 40, 16, 32, 10, 2, None),           # keys all after the query: all masked
    (1, 4, 32, 77, 16, 16, None, 8, 1),            # window 1: one key per row
    (2, 2, 16, 33, 16, 0, None, 16, None),         # more splits than tiles
]


def _run(case, dyadic: bool, seed: int):
    hkv, r, d, s_len, tkv, k0, last, splits, window = case
    g = torch.Generator().manual_seed(seed)
    q = _q(hkv, r, d, g, dyadic)
    k, v = _kv(hkv, s_len, d, tkv, g, dyadic)
    last = k0 + s_len - 1 if last is None else last
    qpos = torch.arange(last - r + 1, last + 1) if r > 2 else last
    scale = 0.125 if dyadic else d ** -0.5
    kw = dict(scale=scale, tkv=tkv, splits=splits, q_offset=qpos, k_offset=k0, window=window)
    ref = flash_attention(q, k, v, causal=True, valid=s_len, q_rounded=True, **kw)
    got = host_attention.decode_attention(q, k, v, valid=s_len, **kw)
    return got, ref, (q, k[:, :s_len], v[:, :s_len], kw), float(v.abs().max())


@pytest.mark.parametrize("case", CASES)
def test_exact_scores_agree_to_fp32_summation(case):
    got, ref, _, vmax = _run(case, dyadic=True, seed=1)
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert (got - ref).abs().max().item() <= 2 ** -20 * vmax, case


@pytest.mark.parametrize("case", CASES)
def test_random_within_the_bf16_flip_bound(case):
    got, ref, (q, k, v, kw), vmax = _run(case, dyadic=False, seed=2)
    diff = (got - ref).abs()
    assert diff.max().item() <= 2 ** -8 * vmax, case
    assert diff.mean().item() <= 2 ** -16 * vmax, case
    loop = flash_attention_loop(q, k, v, causal=True, **kw)       # the literal tile loop
    assert (got - loop).abs().max().item() <= 2 ** -8 * vmax, case


def test_all_masked_rows_are_zero():
    got, ref, _, _ = _run(CASES[4], dyadic=False, seed=3)
    assert not got.any() and not ref.any()


def test_errors_name_the_layout():
    q, k = torch.zeros(1, 1, 8), torch.zeros(1, 20, 8)
    with pytest.raises(ValueError, match="tile-aligned"):
        host_attention.decode_attention(q, k, k, scale=1.0, tkv=16, splits=1, q_offset=0,
                                        k_offset=0, valid=20, window=None)


@pytest.fixture(scope="module", params=("qwen3", "llama", "gemma3"))
def tiny_model(request, tmp_path_factory):
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp(request.param)
    model = build_model(request.param, path)
    return request.param, path, model


PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]


def _decode(path, kernel: bool, monkeypatch):
    from torch_xdna.engine.llm.generate import load_decoder
    monkeypatch.setattr(host_attention, "ENABLED", kernel)
    calls = []
    real = host_attention.decode_attention
    monkeypatch.setattr(host_attention, "decode_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    eng = load_decoder(path, "bf16", max_context=96, prefill_chunk=8, quiet=True, cache_dir=False)
    try:
        dec = eng.decoder
        lg = dec.forward(PROMPT)
        out, toks = [lg], [int(lg.argmax())]
        for _ in range(20):                     # positions 12..31: past a 16-key tile
            lg = dec.forward([toks[-1]])
            out.append(lg)
            toks.append(int(lg.argmax()))
    finally:
        eng.close()
    assert bool(calls) == kernel                 # the decode steps took the kernel
    return toks, out


def test_engine_tokens_with_and_without_the_kernel(tiny_model, monkeypatch):
    fam, path, model = tiny_model
    from llm_fixtures import hf_greedy
    hf = hf_greedy(model, PROMPT, 8)
    toks0, base = _decode(path, False, monkeypatch)
    toks1, got = _decode(path, True, monkeypatch)
    assert toks0[:8] == hf and toks1[:8] == hf, fam
    assert toks1 == toks0, fam
    for a, b in zip(got, base):
        assert (a - b).abs().max().item() <= 2 ** -7 * b.abs().max().item(), fam
