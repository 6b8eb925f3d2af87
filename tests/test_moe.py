"""Mixture-of-experts decoders (Qwen3-MoE; gpt-oss: tests/test_gpt_oss.py): the spec, the bytes they are charged, estimates,
refusals and serving. Logits and greedy tokens against transformers: tests/test_llm_families.py.

A random-weight Qwen3-MoE directory (transformers' Qwen3MoeConfig, save_pretrained: per-expert
tensors as real checkpoints store them; 8 experts, 2 per token, layer 1 dense) loaded by the
engine's own loader. A decode token is charged the router plus exactly top_k experts per MoE
layer; a prefill chunk exactly the distinct experts its rows chose, which is checked against
transformers' own router outputs.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from llm_fixtures import build_model, copy_without, decode_charged, prefill_hits
from torch_xdna.engine.llm.decoder import PrecisionPolicy
from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.kernels.blocks.moe import MoeBlockDesign, expected_hits
from torch_xdna.models.spec import UnsupportedModelError

PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]      # 12 tokens: chunks of 8 + 4


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_moe")
    return path, build_model("qwen3_moe", path)


def _engine(path, precision, layout="layer", chunk=8):
    return load_decoder(path, precision, max_context=96, prefill_chunk=chunk, quiet=True,
                        cache_dir=False, layout=layout)



def test_spec_from_config(moe):
    path, hf = moe
    eng = _engine(path, "bf16")
    s = eng.spec
    assert (s.family, s.experts, s.experts_per_token, s.expert_intermediate) == ("qwen3_moe", 8, 2, 32)
    assert s.moe_layers == (True, False, True) and s.norm_topk_prob
    # params() counts the matmul weights and embeddings (no norms)
    assert s.params() == sum(p.numel() for n, p in hf.named_parameters() if "norm" not in n)
    eng.close()





def _moe_block(eng) -> MoeBlockDesign:
    prog = eng.decoder.program(1, True)
    return next(l.design.mlp for l in prog.launches if l.design.kind == "llm_moe_layer")


def test_decode_charges_router_and_top_k_experts_only(moe):
    path, _ = moe
    eng = _engine(path, "int4")
    spec = eng.spec
    # the same step from shapes alone (decode: exactly top_k experts, no routing assumption)
    got, want = decode_charged(eng, PROMPT)
    assert got == want["dram_bytes"]
    moe_block = _moe_block(eng)
    per_expert = moe_block.expert_bytes()
    moe_layers = sum(spec.moe_layers)
    assert want["expert_bytes"] == moe_layers * spec.experts_per_token * per_expert
    # all experts streamed would cost (E - k) more experts per MoE layer
    dense_like = got + moe_layers * (spec.experts - spec.experts_per_token) * per_expert
    assert got < dense_like
    eng.close()


def test_prefill_charges_exactly_the_experts_hit(moe, monkeypatch):
    """Each MoE launch of an 8-row prefill chunk is charged the distinct experts its rows
    chose, and those are transformers' router choices for the same rows."""
    path, hf = moe
    eng = _engine(path, "fp32")
    charged, want = prefill_hits(monkeypatch, eng, hf, PROMPT[:8])
    assert [h for _, h in charged] == want and all(n == 8 for n, _ in charged)
    assert len(want) == 2 and max(want) <= 8
    eng.close()


def test_expected_hits():
    assert expected_hits(128, 8, 1) == 8
    assert expected_hits(128, 8, 2) == 16          # 128 (1 - (120/128)^2) = 15.5
    assert expected_hits(128, 8, 128) == 128
    assert expected_hits(8, 2, 4) <= 8


def test_resident_estimate_counts_every_expert(moe):
    from torch_xdna.engine.llm.decoder import resident_bytes_estimate
    path, _ = moe
    eng = _engine(path, "int4")
    dec = eng.decoder
    est = resident_bytes_estimate(eng.spec, dec.policy, dec.capacity, dec.chunk)
    assert abs(est - dec.resident_bytes) <= 0.02 * dec.resident_bytes
    eng.close()


def test_estimate_qwen3_30b_a3b_shapes():
    """Modeled (cost model), from Qwen3-30B-A3B's config shapes: 30.5B parameters, 3.3B
    active; a token streams the router and 8 of 128 experts per layer."""
    _, spec = resolve_spec("qwen3-30b-a3b")
    assert 30.0e9 < spec.params() < 31.0e9 and 3.2e9 < spec.params(active=True) < 3.5e9
    rows = [estimate(spec, "int4", c) for c in (1024, 4096, 32768)]
    fe, h = 768, 2048
    per_expert = 3 * fe * h * (0.5 + 2 / 32)                   # int4 g32: nibbles + bf16 scales
    for r in rows:
        assert r["expert_mb_per_token"] * 1e6 == pytest.approx(48 * 8 * per_expert)
        assert r["dispatches_per_token"] == 1 and r["launches_per_layer"] == 1
    assert rows[0]["modeled_decode_tok_s"] > rows[1]["modeled_decode_tok_s"] > rows[2]["modeled_decode_tok_s"]
    # streaming every expert would be ~9x the bytes of the active ones
    assert rows[0]["weight_mb_per_token"] < 0.25 * spec.params() * 0.5625 / 1e6


def test_unsupported_moe_configs_refused_by_name(moe, tmp_path):
    path, _ = moe
    cfg = json.loads((path / "config.json").read_text())
    for patch, word in (({"shared_expert_intermediate_size": 64}, "shared_expert"),
                        ({"num_experts_per_tok": 9}, "num_experts_per_tok")):
        d = tmp_path / word
        shutil.copytree(path, d)
        (d / "config.json").write_text(json.dumps({**cfg, **patch}))
        with pytest.raises(UnsupportedModelError, match=word):
            load_decoder(d, quiet=True)


def test_missing_expert_weight_named(moe, tmp_path):
    from torch_xdna.models.hf import ModelDirError
    path, _ = moe
    d = copy_without(path, tmp_path / "broken", "model.layers.2.mlp.experts.5.up_proj.weight")
    with pytest.raises(ModelDirError, match=r"experts\.5\.up_proj"):
        load_decoder(d, quiet=True)


def test_policy_groups_divide_the_expert_width(moe):
    path, _ = moe
    _, spec = resolve_spec(str(path))
    assert PrecisionPolicy.parse("int4").block_group(spec, "mlp") == 32
