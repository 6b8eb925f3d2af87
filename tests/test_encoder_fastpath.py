"""The simulator's host fast path for encoder blocks keeps the NPU numerics and batch invariance.

- in-place epilogues, a single rounding of Q/K/V and the threshold flush of softmax probabilities
  give the same values bit for bit as the plain reference ops;
- host_gemm.gemm_rows (the host's fp32 GEMM on bf16-valued operands) is within the fp32
  accumulation bound K * 2^-23 * sum|x||w| of an fp64 product, and each row's bits do not depend
  on the other rows;
- the encoder blocks computed over real tokens only equal the padded-layout computation within
  fp32 accumulation-order tolerance;
- a sentence's embedding is bit-identical whatever batch (partners, padded length) it is in.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from torch_xdna.kernels import numerics

from torch_xdna.kernels.host import gemm as host_gemm
from torch_xdna.kernels.activations import apply_epilogue, apply_epilogue_
from torch_xdna.kernels.ops.attention import attention_reference
from torch_xdna.kernels.blocks.encoder import (EncoderAttentionDesign, EncoderFFNDesign,
                                               EncoderPoolDesign, prefix_lengths)


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


def test_gemm_operand_is_operand_up_to_the_sign_of_flushed_zeros():
    """gemm_operand flushes like operand (a GELU output holds subnormals), only the sign of a
    flushed zero may differ; and a GEMM on either gives the same bits."""
    g = torch.Generator().manual_seed(6)
    x = apply_epilogue("gelu", torch.randn(64, 384, generator=g) * 12)   # tiny negatives
    x[0, :6] = torch.tensor([2.0 ** -130, -(2.0 ** -130), -0.0, 0.0, float("inf"), float("nan")])
    assert bool(((x.abs() > 0) & (x.abs() < numerics.FP32_MIN_NORMAL)).any())
    got, want = numerics.gemm_operand(x), numerics.operand(x)
    assert torch.equal(got.nan_to_num(), want.nan_to_num()) and bool(got[0, 5].isnan())
    x[0, 4:] = 1.0                                       # finite, for the GEMM
    got, want = numerics.gemm_operand(x), numerics.operand(x)
    w = numerics.operand(torch.randn(384, 96, generator=g) / 20)
    assert torch.equal(host_gemm.gemm_rows(got, w), host_gemm.gemm_rows(want, w))
    assert torch.equal(numerics.gemm_operand(x.bfloat16()), numerics.gemm_operand(x))


def test_layer_norm_in_place_equals_the_written_out_formula():
    from torch_xdna.kernels.blocks.encoder import layer_norm_design
    g = torch.Generator().manual_seed(7)
    x = torch.randn(40, 384, generator=g) * 3 + 1
    w = (1 + torch.randn(384, generator=g) / 10).bfloat16()
    b = (torch.randn(384, generator=g) / 10).bfloat16()
    out = torch.empty(40, 384)
    layer_norm_design(40, 384, 1e-12).reference([x, w, b], [out])
    xo, wo, bo = numerics.operand(x), w.float(), b.float()
    mean = xo.mean(-1, keepdim=True)
    var = ((xo - mean) ** 2).mean(-1, keepdim=True)
    want = (xo - mean) * torch.rsqrt(var + 1e-12) * wo + bo
    assert torch.equal(out, want)


def test_rounded_attention_equals_reference():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 16, 32, generator=g) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 16)
    mask[1, ..., 11:] = float("-inf")
    want = attention_reference(q, k, v, scale=0.17, mask=mask)
    ops = [numerics.operand(t) for t in (q, k, v)]
    assert torch.equal(attention_reference(*ops, scale=0.17, mask=mask, rounded=True), want)


@pytest.mark.parametrize("packed", [False, True])
def test_gemm_rows_within_accumulation_bound_and_row_independent(packed):
    g = torch.Generator().manual_seed(3)
    rows, k, n = 96, 384, 160
    xo = numerics.operand(torch.randn(rows, k, generator=g))
    wo = numerics.operand(torch.randn(k, n, generator=g) / math.sqrt(k))
    pw = host_gemm.pack(wo) if packed else None
    if packed and pw is None:
        pytest.skip("no row-invariant oneDNN packed GEMM on this host")
    got = host_gemm.gemm_rows(xo, wo, pw)
    exact = xo.double() @ wo.double()
    bound = k * 2.0 ** -23 * (xo.abs().double() @ wo.abs().double())
    assert bool(((got.double() - exact).abs() <= bound).all())
    for lo, hi in ((0, 1), (0, 3), (5, 9), (17, 50), (40, 96)):      # any subset, any offset
        assert torch.equal(host_gemm.gemm_rows(xo[lo:hi], wo, pw), got[lo:hi]), (lo, hi)


def test_packed_gemm_is_used_on_encoder_shapes_and_can_be_turned_off(monkeypatch):
    """The encoder's resident weights get a packed form (once: the operand cache) where this
    host's oneDNN is row-invariant; TORCH_XDNA_HOST_KERNELS=0 gives None (torch.mm)."""
    from torch_xdna.kernels.blocks.encoder import _packed_w
    w = (torch.randn(384, 1152, generator=torch.Generator().manual_seed(9)) / 20).bfloat16()
    if not (host_gemm.packing_enabled() and host_gemm.packed_invariant(384, 1152)):
        pytest.skip("no row-invariant oneDNN packed GEMM on this host")
    assert _packed_w(w) is _packed_w(w)
    monkeypatch.setenv("TORCH_XDNA_HOST_KERNELS", "0")
    assert _packed_w(w) is None and host_gemm.pack(w.float()) is None


def test_prefix_lengths():
    m = torch.zeros(3, 8)
    m[0, 5:] = float("-inf")
    m[2, 1:] = float("-inf")
    assert prefix_lengths(m) == [5, 8, 1]
    m[1, 2] = float("-inf")                                   # a hole: not a prefix mask
    assert prefix_lengths(m) is None


def _weights(h: int, inter: int, g: torch.Generator) -> dict:
    bf = torch.bfloat16
    return {"w_qkv": (torch.randn(h, 3 * h, generator=g) / 8).to(bf),
            "b_qkv": (torch.randn(3 * h, generator=g) * 0.1).to(bf),
            "w_o": (torch.randn(h, h, generator=g) / 8).to(bf),
            "b_o": (torch.randn(h, generator=g) * 0.1).to(bf),
            "w1": (torch.randn(h, inter, generator=g) / 8).to(bf),
            "b1": (torch.randn(inter, generator=g) * 0.1).to(bf),
            "w2": (torch.randn(inter, h, generator=g) / 11).to(bf),
            "b2": (torch.randn(h, generator=g) * 0.1).to(bf),
            "ln_w": (1 + torch.randn(h, generator=g) * 0.1).to(bf),
            "ln_b": (torch.randn(h, generator=g) * 0.1).to(bf)}


def _layer(b: int, s: int, h: int, nh: int, w: dict, x: torch.Tensor,
           mask: torch.Tensor) -> torch.Tensor:
    """One attention + FFN layer on the real-token path (a prefix mask)."""
    attn = EncoderAttentionDesign(b, s, h, nh, 1e-12)
    ffn = EncoderFFNDesign(b * s, h, 4 * h, 1e-12, chunk=s, masked=True)
    mid, out = torch.empty(b * s, h), torch.empty(b * s, h)
    attn.reference([x, w["w_qkv"], w["b_qkv"], mask, w["w_o"], w["b_o"], w["ln_w"], w["ln_b"]],
                   [mid])
    ffn.reference([mid, w["w1"], w["b1"], w["w2"], w["b2"], w["ln_w"], w["ln_b"], mask], [out])
    return out


def test_real_token_blocks_match_padded_layout():
    b, s, h, nh = 3, 16, 64, 4
    g = torch.Generator().manual_seed(4)
    w = _weights(h, 4 * h, g)
    lengths = [16, 9, 3]
    mask = torch.full((b, s), float("-inf"))
    for i, n in enumerate(lengths):
        mask[i, :n] = 0.0
    x = torch.randn(b * s, h, generator=g)
    fast = _layer(b, s, h, nh, w, x, mask)
    # the general path on the same numbers: a mask value of -1e30 instead of -inf is not a
    # prefix mask (prefix_lengths needs -inf) but gives the same zero probabilities
    m2 = mask.masked_fill(torch.isinf(mask), -1e30)
    assert prefix_lengths(m2) is None
    attn = EncoderAttentionDesign(b, s, h, nh, 1e-12)
    ffn = EncoderFFNDesign(b * s, h, 4 * h, 1e-12, chunk=s)
    mid, ref = torch.empty(b * s, h), torch.empty(b * s, h)
    attn.reference([x, w["w_qkv"], w["b_qkv"], m2, w["w_o"], w["b_o"], w["ln_w"], w["ln_b"]],
                   [mid])
    ffn.reference([mid, w["w1"], w["b1"], w["w2"], w["b2"], w["ln_w"], w["ln_b"]], [ref])
    real = (mask == 0).view(-1)
    torch.testing.assert_close(fast[real], ref[real], atol=2e-5, rtol=2e-5)
    assert bool((fast[~real] == 0).all()), "padding rows are zero"
    # pooling over the real tokens equals the masked sum of the padded layout
    pool = EncoderPoolDesign(b, s, h)
    p1, p2 = torch.empty(b, h), torch.empty(b, h)
    pool.reference([fast, mask], [p1])
    pool.reference([fast, m2.masked_fill(m2 < 0, 1.0)], [p2])   # general path: keep == (m == 0)
    torch.testing.assert_close(p1, p2, atol=1e-6, rtol=1e-5)


def test_layer_result_of_a_sequence_ignores_batch_and_padding():
    """The same sequence in batches of different size, partners and padded length: same bits."""
    h, nh = 64, 4
    g = torch.Generator().manual_seed(5)
    w = _weights(h, 4 * h, g)
    seq = torch.randn(7, h, generator=g)
    outs = []
    for b, s, pos in ((1, 8, 0), (4, 16, 2), (3, 40, 1), (8, 24, 7)):
        x = torch.randn(b * s, h, generator=g)
        mask = torch.full((b, s), float("-inf"))
        for i in range(b):
            n = 7 if i == pos else random.Random(b * 10 + i).randint(1, s)
            mask[i, :n] = 0.0
        x.view(b, s, h)[pos, :7] = seq
        outs.append(_layer(b, s, h, nh, w, x, mask).view(b, s, h)[pos, :7])
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


@pytest.mark.parametrize("h,nh", [(64, 4), (128, 4)])
def test_equal_length_runs_batched_equal_each_sequence_alone(h, nh):
    """Attention runs one batched call per run of equal lengths; each sequence's layer output
    is bit for bit what it gets alone (one call per sequence, the per-sequence path)."""
    from torch_xdna.kernels.blocks.encoder import equal_runs
    assert equal_runs([5, 5, 5, 9, 9, 3, 5]) == [(5, 3), (9, 2), (3, 1), (5, 1)]
    g = torch.Generator().manual_seed(11)
    w = _weights(h, 4 * h, g)
    lengths, s = [5, 5, 5, 9, 9, 3, 5, 16], 16
    b = len(lengths)
    x = torch.randn(b * s, h, generator=g) * 2
    mask = torch.full((b, s), float("-inf"))
    for i, n in enumerate(lengths):
        mask[i, :n] = 0.0
    out = _layer(b, s, h, nh, w, x, mask).view(b, s, h)
    for i, n in enumerate(lengths):
        alone = _layer(1, n, h, nh, w, x.view(b, s, h)[i, :n].clone(), torch.zeros(1, n))
        assert torch.equal(out[i, :n], alone), (i, n)


@pytest.fixture(scope="module")
def embedder():
    from torch_xdna.engine.embed.embedder import Embedder
    emb = Embedder.load()
    yield emb
    emb.close()


def test_sentence_embedding_is_bit_identical_in_any_batch(embedder):
    """Real all-MiniLM-L6-v2: each sentence alone, then inside batches with partners of other
    lengths (so other padded lengths and batch sizes): identical vectors."""
    texts = ["Hello world.", "a", "What is the capital of France?",
             "The NPU streams weights from DRAM; batching amortizes the dispatch cost.",
             "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
             "fifteen sixteen seventeen eighteen nineteen twenty",
             "Machine learning models transform sentences into dense vectors."]
    alone = torch.cat([embedder.embed([t]) for t in texts])
    from torch_xdna.engine.embed.embedder import EmbedStats
    st = EmbedStats()
    together = embedder.embed(texts, st)
    assert torch.equal(together, alone)
    rng = random.Random(0)
    for _ in range(2):
        order = rng.sample(range(len(texts)), len(texts))
        got = embedder.embed([texts[i] for i in order])
        assert torch.equal(got, alone[order])
    # sentences of equal token counts share one batched attention call: same bits as alone
    same = ["Hello world.", "Hello there.", "Goodbye world.", "a", "b"]
    assert len({len(x) for x in embedder.tokenize(same[:3])}) == 1
    same_alone = torch.cat([embedder.embed([t]) for t in same])
    assert torch.equal(embedder.embed(same), same_alone)
    # a short sentence padded up to a long partner's length in the same Program
    pair = embedder.embed([texts[1], texts[4]])
    assert torch.equal(pair, alone[[1, 4]])
