"""OPT as a decoder family (learned positions, pre-LayerNorm with biases, ReLU MLP, biases on
every projection): the spec, estimates and refusals. Logits, greedy tokens and batched decode
against transformers' OPTForCausalLM: tests/test_llm_families.py.
"""
from __future__ import annotations

import json
import shutil

import pytest

from llm_fixtures import build_model
from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.engine.llm.generate import load_decoder
from torch_xdna.models.spec import UnsupportedModelError

PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]


@pytest.fixture(scope="module")
def opt(tmp_path_factory):
    path = tmp_path_factory.mktemp("opt")
    return path, build_model("opt", path)


def _engine(path, precision, layout="layer"):
    return load_decoder(path, precision, max_context=96, prefill_chunk=8, quiet=True,
                        cache_dir=False, layout=layout)



def test_spec(opt):
    path, hf = opt
    _, spec = resolve_spec(str(path))
    assert (spec.family, spec.layer_norm, spec.linear_bias, spec.gated_mlp) == ("opt", True, True, False)
    assert spec.ropes == {} and spec.learned_positions == 512 + 2 and spec.act == "relu"
    assert spec.params() == sum(p.numel() for n, p in hf.named_parameters()
                                if "norm" not in n and not n.endswith("bias"))






def test_estimate_opt_125m():
    """Modeled, from facebook/opt-125m's config shapes: 125M parameters, a ReLU MLP (2 weights,
    not 3), one launch per layer."""
    _, spec = resolve_spec("opt-125m")
    assert 120e6 < spec.params() < 130e6
    r = estimate(spec, "bf16", 1024)
    assert r["launches_per_layer"] == 1 and r["dispatches_per_token"] == 1
    # every weight once (the tied table as lm_head); the position table is gathered, not streamed
    streamed = spec.params() - spec.learned_positions * spec.hidden
    assert r["weight_mb_per_token"] == pytest.approx(streamed * 2 / 1e6, rel=1e-3)


def test_unsupported_opt_configs_refused_by_name(opt, tmp_path):
    path, _ = opt
    cfg = json.loads((path / "config.json").read_text())
    for patch, word in (({"do_layer_norm_before": False}, "do_layer_norm_before"),
                        ({"word_embed_proj_dim": 32}, "word_embed_proj_dim")):
        d = tmp_path / word
        shutil.copytree(path, d)
        (d / "config.json").write_text(json.dumps({**cfg, **patch}))
        with pytest.raises(UnsupportedModelError, match=word):
            load_decoder(d, quiet=True)
