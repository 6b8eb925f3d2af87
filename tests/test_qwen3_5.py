"""Qwen3.5 hybrid decoders: gated DeltaNet (linear attention) layers with device-resident
recurrent states, interleaved with gated full-attention layers (partial RoPE, output gate).

A random-weight Qwen3_5TextConfig directory (3 DeltaNet layers then one attention layer) against
transformers' Qwen3_5ForCausalLM (its torch chunked / recurrent delta rule). fp32 verification
mode: an 80-token prompt (the delta rule's chunked form crosses its 64-token sub-chunk inside
one launch, and in 32-row engine chunks the state carries across launches), then 32 greedy
tokens in the recurrent form, identical to transformers. The KV cache holds the attention
layers only; n samples restart from the prefill's states.
"""
from __future__ import annotations

import json

import pytest
import torch

from llm_fixtures import build_model, check_against_transformers, hf_greedy
from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.models.spec import UnsupportedModelError

LONG = torch.randint(5, 390, (80,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3_5")
    return path, build_model("qwen3_5", path)


@pytest.mark.parametrize("chunk", [128, 32])
def test_long_prompt_across_chunks_matches_transformers(hybrid, chunk):
    path, hf = hybrid
    eng = load_decoder(path, "fp32", max_context=160, prefill_chunk=chunk, quiet=True,
                       cache_dir=False)
    check_against_transformers(eng, hf, LONG, None, extra=(200, 150, 9))
    r = eng.complete(LONG, GenerationConfig(max_tokens=32, stop_token_ids=()))
    assert r.token_ids == hf_greedy(hf, LONG, 32)
    eng.close()


def test_kv_for_attention_layers_only_and_states_resident(hybrid):
    path, _ = hybrid
    eng = load_decoder(path, "bf16", max_context=64, quiet=True, cache_dir=False)
    dec, spec = eng.decoder, eng.spec
    assert spec.layer_kinds == ("linear",) * 3 + ("attention",) and spec.rotary_dim == 8
    assert len(dec.cache.k) == 1 and sorted(dec.states) == [0, 1, 2]
    assert eng.prefix_cache is None                 # its blocks hold KV rows, not states
    conv, state = dec.states[0]
    assert conv.shape == (spec.linear_conv_dim, 3) and state.shape == (4, 16, 8)
    eng.close()


def test_n_samples_restart_from_the_prefill_state(hybrid):
    path, _ = hybrid
    eng = load_decoder(path, "fp32", max_context=96, quiet=True, cache_dir=False)
    cfg = GenerationConfig(max_tokens=6, stop_token_ids=(), n=2)
    got: dict[int, list[int]] = {}
    for c in eng.generate(LONG[:20], cfg):
        got.setdefault(c.index, []).extend(c.token_ids)
    alone = eng.complete(LONG[:20], GenerationConfig(max_tokens=6, stop_token_ids=())).token_ids
    assert got[0] == got[1] == alone                # greedy: both samples equal the single one
    eng.close()


def test_estimate_qwen3_5_shapes():
    """Modeled, from Qwen3.5-0.8B's config shapes: only 6 of 24 layers hold KV, so the KV bytes
    per token grow 4x slower with context than if every layer attended."""
    _, spec = resolve_spec("qwen3.5-0.8b")
    assert len(spec.attention_layers) == 6 and 0.7e9 < spec.params() < 0.8e9
    rows = {c: estimate(spec, "int4", c) for c in (1024, 4096, 32768)}
    per_token_kv = 6 * 2 * spec.kv_heads * spec.head_dim * 2        # bf16 K and V, 6 layers
    grow = rows[32768]["kv_mb_per_token"] - rows[1024]["kv_mb_per_token"]
    assert grow * 1e6 == pytest.approx((32768 - 1024) * per_token_kv, rel=0.02)
    assert rows[1024]["modeled_decode_tok_s"] > rows[32768]["modeled_decode_tok_s"]


def test_vision_language_config_modeled_but_refused_at_load(tmp_path):
    from torch_xdna.models.families import BUILTIN_CONFIGS
    text = dict(BUILTIN_CONFIGS["qwen3.5-0.8b"])
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_5", "tie_word_embeddings": True,
         "text_config": {**text, "model_type": "qwen3_5_text"}}))
    _, spec = resolve_spec(str(tmp_path))
    assert spec.layers == 24 and spec.run_refusal
    with pytest.raises(UnsupportedModelError, match="vision-language"):
        load_decoder(tmp_path, quiet=True)
