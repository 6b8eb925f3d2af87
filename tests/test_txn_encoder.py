"""The fused encoder blocks at the transaction level (kernels/lower/encoder.py).

EncoderAttentionDesign and EncoderFFNDesign run as their stage programs' instruction streams
and are compared bit for bit (torch.equal) with the functional level in the stages' order
(TORCH_XDNA_LAYER_ORDER=plan, encoder_stages.staged_reference), at a tiny random shape with a
padded batch and at the default embedding model's shapes (all-MiniLM-L6-v2: hidden 384, 12
heads of 32, intermediate 1536, one 128-token bucket). The stage order is checked against the
blocks' default references on the real tokens (cosine and max error). Transaction level only:
nothing here is a hardware result.
"""
from __future__ import annotations

import pytest
import torch

import torch_xdna.kernels.aie.refs  # noqa: F401  (core-kernel references + the lowering hook)
from torch_xdna.array.validate import validate
from torch_xdna.hw import NPU4
from torch_xdna.kernels.blocks.encoder import EncoderAttentionDesign, EncoderFFNDesign
from torch_xdna.kernels.lower import lower
from torch_xdna.runtime.sim import txn_level

SHAPES = {"tiny": (2, 16, 64, 2, 128), "minilm": (1, 128, 384, 12, 1536)}


def _inputs(b: int, s: int, h: int, i: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, sc=1.0):
        return torch.randn(*shape, generator=g) * sc

    def bf(t):
        return t.to(torch.bfloat16)
    x = r(b * s, h)
    mask = torch.zeros(b, s)
    if b > 1:
        mask[1, s // 2:] = float("-inf")            # a padded sequence
    attn = [x, bf(r(h, 3 * h, sc=h ** -0.5)), bf(r(3 * h, sc=0.1)), mask, bf(r(h, h, sc=h ** -0.5)),
            bf(r(h, sc=0.1)), bf(1 + 0.1 * r(h)), bf(0.1 * r(h))]
    ffn = [x, bf(r(h, i, sc=h ** -0.5)), bf(r(i, sc=0.1)), bf(r(i, h, sc=i ** -0.5)), bf(r(h, sc=0.1)),
           bf(1 + 0.1 * r(h)), bf(0.1 * r(h)), mask]
    return attn, ffn, mask


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_encoder_blocks_txn_bit_identical_to_stage_order(shape, monkeypatch):
    b, s, h, nh, i = SHAPES[shape]
    attn_in, ffn_in, mask = _inputs(b, s, h, i)
    designs = [(EncoderAttentionDesign(b, s, h, nh, 1e-12), attn_in, 9),
               (EncoderFFNDesign(b * s, h, i, 1e-12, chunk=s, masked=True), ffn_in, 6)]
    keep = mask.reshape(-1) == 0
    runner = txn_level.TxnRunner(NPU4)
    for d, ins, n_progs in designs:
        progs = lower(d, NPU4)
        assert len(progs) == n_progs == len(d.runs())      # the cost model charges each program
        for p in progs:
            validate(p, NPU4)
        out = {k: torch.zeros(b * s, h) for k in ("txn", "plan", "blas")}
        runner.run(d, ins, [out["txn"]], {})
        assert runner.last["stages"] == n_progs
        for k in ("plan", "blas"):
            monkeypatch.setenv("TORCH_XDNA_LAYER_ORDER", k)
            d.reference(ins, [out[k]])
        assert torch.equal(out["plan"], out["txn"]), d.kind
        a, ref = out["plan"][keep], out["blas"][keep]
        cos = torch.nn.functional.cosine_similarity(a, ref, dim=-1)
        assert float(cos.min()) >= 0.9999, (d.kind, float(cos.min()))
        assert float((a - ref).abs().max()) <= 2 ** -5 * float(ref.abs().max())


def test_encoder_stage_programs_are_wired():
    d = EncoderAttentionDesign(2, 16, 64, 2, 1e-12)
    notes = [dict(p.notes) for p in lower(d, NPU4)]
    assert [n["stage"].split(".")[1] for n in notes] == [
        "x_cast", "qkv_proj", "qkv_proj", "head_split", "attention", "head_merge", "o_proj",
        "o_proj", "ln"]
    assert notes[0]["launch_args"] == ("x", "w_qkv", "b_qkv", "mask", "w_o", "b_o", "ln_w",
                                       "ln_b", "out")
    assert "launch_args" not in notes[1] and notes[0]["host_layout"] == "encoder_stages.host_inputs"
    f = EncoderFFNDesign(32, 64, 128, 1e-12, chunk=16, masked=True)
    fn = dict(lower(f, NPU4)[0].notes)
    assert fn["host_layout"] == "encoder_stages.host_inputs"      # the unread mask is dropped
    assert fn["launch_args"][-2:] == ("ln_b", "out")


@pytest.mark.parametrize("mode,normalize", [("mean", True), ("cls", True), ("mean", False),
                                            ("weightedmean", True), ("lasttoken", True)])
def test_pool_txn_bit_identical_to_stage_order(mode, normalize, monkeypatch):
    """A padded batch: a half-masked sequence and an empty (batch padding) row, which pools to
    zeros at both levels."""
    from torch_xdna.kernels.blocks.encoder import EncoderPoolDesign
    b, s, h = 4, 16, 64
    x = torch.randn(b * s, h, generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(b, s)
    mask[1, s // 2:] = float("-inf")
    mask[2] = float("-inf")
    d = EncoderPoolDesign(b, s, h, mode, normalize)
    out = {k: torch.zeros(b, h) for k in ("txn", "plan", "blas")}
    runner = txn_level.TxnRunner(NPU4)
    runner.run(d, [x, mask], [out["txn"]], {})
    assert runner.last["stages"] == (3 if normalize else 2)
    for k in ("plan", "blas"):
        monkeypatch.setenv("TORCH_XDNA_LAYER_ORDER", k)
        d.reference([x, mask], [out[k]])
    assert torch.equal(out["plan"], out["txn"])
    assert not out["txn"][2].any()
    real = [0, 1, 3]
    cos = torch.nn.functional.cosine_similarity(out["plan"][real], out["blas"][real], dim=-1)
    assert float(cos.min()) >= 0.9999, float(cos.min())
    if normalize:
        assert torch.allclose(out["txn"][real].norm(dim=-1), torch.ones(3), atol=1e-5)


def test_embedding_txn_bit_identical_per_ids(monkeypatch):
    """The gathers' streams are made from each launch's ids; the result equals the block's
    default reference bit for bit (gathers and exact fp32 adds, then the same layer_norm)."""
    from torch_xdna.kernels.blocks.encoder import EncoderEmbeddingDesign
    g = torch.Generator().manual_seed(4)
    v, p, h, b, s = 100, 32, 64, 2, 16
    d = EncoderEmbeddingDesign(v, p, h, b, s, 1e-12)
    tables = [torch.randn(v, h, generator=g).bfloat16(), torch.randn(p, h, generator=g).bfloat16(),
              torch.randn(2, h, generator=g).bfloat16(), (1 + 0.1 * torch.randn(h, generator=g)).bfloat16(),
              (0.1 * torch.randn(h, generator=g)).bfloat16()]
    runner = txn_level.TxnRunner(NPU4)
    for _ in range(2):
        ids = torch.randint(0, v, (b * s,), generator=g, dtype=torch.int32)
        out = {k: torch.zeros(b * s, h) for k in ("txn", "plan", "blas")}
        runner.run(d, [*tables, ids], [out["txn"]], {})
        for k in ("plan", "blas"):
            monkeypatch.setenv("TORCH_XDNA_LAYER_ORDER", k)
            d.reference([*tables, ids], [out[k]])
        assert torch.equal(out["plan"], out["txn"]) and torch.equal(out["blas"], out["txn"])
    assert runner.last["stages"] == 6
