"""RoPE tables and long-context scaling against transformers' own rotary embeddings.

Reference: transformers (installed test dependency) modeling_rope_utils (_compute_llama3_parameters,
_compute_yarn_parameters, linear) and each family's RotaryEmbedding.forward. Our tables must equal
transformers' cos/sin bit for bit (both compute in fp32 in the same order) at every position up to
the long contexts used (40K): one ulp of a frequency is ~1e-3 rad at 32K positions.
"""
from __future__ import annotations

import pytest
import torch

from torch_xdna.models.families import spec_from_config

POS = torch.tensor([[0, 1, 7, 511, 4095, 8191, 9000, 32767, 40959]])


def _hf_tables(model_type: str, cfg: dict, layer_type: str | None = None):
    from transformers import AutoConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding
    c = AutoConfig.for_model(model_type, **cfg)
    x = torch.zeros(1, dtype=torch.float32)
    if model_type == "gemma3_text":
        return Gemma3RotaryEmbedding(c)(x, POS, layer_type)
    rot = {"llama": LlamaRotaryEmbedding, "qwen3": Qwen3RotaryEmbedding}[model_type](c)
    return rot(x, POS)


def _ours(spec, name: str):
    cos, sin = spec.ropes[name].tables(spec.head_dim, int(POS.max()) + 1)
    return cos[POS[0]], sin[POS[0]]


BASE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            intermediate_size=512, num_hidden_layers=2, vocab_size=100)

CASES = {
    "llama3.2 (llama3 scaling, factor 32)": ("llama", dict(
        BASE, max_position_embeddings=131072, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "qwen3 default": ("qwen3", dict(BASE, max_position_embeddings=40960, rope_theta=1e6)),
    "qwen3 YaRN factor 4 (Qwen's 128K recipe)": ("qwen3", dict(
        BASE, max_position_embeddings=131072, rope_theta=1e6,
        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 32768})),
    "qwen3 YaRN with beta/attention_factor": ("qwen3", dict(
        BASE, max_position_embeddings=65536, rope_theta=1e6,
        rope_scaling={"rope_type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2,
                      "attention_factor": 1.2, "original_max_position_embeddings": 32768})),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tables_match_transformers(case):
    model_type, cfg = CASES[case]
    spec = spec_from_config({"model_type": model_type, **cfg})
    cos, sin = _ours(spec, "global")
    hc, hs = _hf_tables(model_type, cfg)
    assert torch.equal(cos, hc[0]) and torch.equal(sin, hs[0]), case


def test_yarn_scales_the_tables_by_its_attention_factor():
    _, cfg = CASES["qwen3 YaRN factor 4 (Qwen's 128K recipe)"]
    rope = spec_from_config({"model_type": "qwen3", **cfg}).ropes["global"]
    assert rope.type == "yarn" and rope.attention_factor == pytest.approx(0.1 * torch.log(
        torch.tensor(4.0)).item() + 1.0)
    cos, sin = rope.tables(64, 2)
    assert cos[0, 0].item() == pytest.approx(rope.attention_factor)


def test_gemma3_local_and_global_tables_match_transformers():
    cfg = dict(BASE, num_key_value_heads=1, max_position_embeddings=32768, sliding_window=512,
               layer_types=["sliding_attention", "full_attention"],
               rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                   "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    spec = spec_from_config({"model_type": "gemma3_text", **cfg})
    assert spec.layer_rope == ("local", "global")
    for name, layer_type in (("global", "full_attention"), ("local", "sliding_attention")):
        cos, sin = _ours(spec, name)
        hc, hs = _hf_tables("gemma3_text", cfg, layer_type)
        assert torch.equal(cos, hc[0]) and torch.equal(sin, hs[0]), name
