"""Qwen3-MoE GGUF files (llama.cpp arch `qwen3moe`): written with gguf's GGUFWriter from a small
random-weight Qwen3MoeForCausalLM the way convert_hf_to_gguf.py writes them (tests/gguf_fixtures.py,
ggml-org/llama.cpp commit 0024aa74: expert_count / expert_used_count /
expert_feed_forward_length, blk.N.ffn_gate_inp F32, ffn_{gate,up,down}_exps stacked 3-D), loaded by
the engine and decoded greedily in fp32 verification mode against transformers holding the same
(for Q8_0: gguf.quants-dequantized) weights; transformers' own GGUF reader loads the same files
(an independent check of the layout); Q8_0 experts map onto int8 g32 with q exact; `xdna generate
FILE.gguf` and `xdna serve` (official openai client) run it.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gguf_fixtures import (add_gpt2_tokenizer, dequantized_like, greedy, random_model,
                           write_gguf)
from llm_fixtures import _config, hf_logits, save_tokenizer
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.models.formats.gguf import open_gguf
from torch_xdna.models.hf import ModelDirError

PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]
TOKENS = 32


def _moe_model():
    """Every layer routed (llama.cpp's qwen3moe has no dense layers: ffn_gate_inp is required
    per layer), 8 experts, 2 per token, norm_topk_prob (what llama.cpp always does)."""
    return random_model(_config("qwen3_moe", mlp_only_layers=[], num_hidden_layers=2))


@pytest.fixture(scope="module")
def hf():
    return _moe_model()


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe-tok")
    save_tokenizer(d)
    return d


def _write(tmp_path, model, qtype, tok_dir, **meta):
    def tok(w):
        add_gpt2_tokenizer(w, tok_dir, "qwen2")
        for k, v in meta.items():                     # extra / overriding metadata
            getattr(w, f"add_{k}")(v)
    return write_gguf(model, "qwen3_moe", tmp_path / f"qwen3moe-{qtype}.gguf", qtype, tok)


def _engine(path, precision="fp32", **kw):
    return load_decoder(path, precision, max_context=64, prefill_chunk=8, quiet=True,
                        cache_dir=False, **kw)


def test_file_layout_is_llama_cpp_s(hf, tmp_path, tok_dir):
    """The keys and tensors of llama.cpp's qwen3moe: stacked experts with ne {H, I, E} /
    {I, H, E}, the router F32, and the config / spec the engine builds from them."""
    path = _write(tmp_path, hf, "Q8_0", tok_dir)
    g = open_gguf(path)
    c = hf.config
    assert g.arch == "qwen3moe"
    assert (g.key("expert_count"), g.key("expert_used_count"),
            g.key("expert_feed_forward_length")) == (8, 2, c.moe_intermediate_size)
    t = g.tensors
    h, i = c.hidden_size, c.moe_intermediate_size
    assert t["blk.0.ffn_gate_exps.weight"].shape.tolist() == [h, i, 8]
    assert t["blk.0.ffn_up_exps.weight"].shape.tolist() == [h, i, 8]
    assert t["blk.1.ffn_down_exps.weight"].shape.tolist() == [i, h, 8]
    assert g.tensor_type("blk.0.ffn_gate_inp.weight") == "F32"
    assert g.tensor_type("blk.0.ffn_down_exps.weight") == "Q8_0"
    cfg = g.config()
    assert cfg["model_type"] == "qwen3_moe" and cfg["norm_topk_prob"] is True
    from torch_xdna.models.families import spec_from_config
    s = spec_from_config(cfg)
    assert (s.experts, s.experts_per_token, s.expert_intermediate) == (8, 2, i)
    assert s.moe_layers == (True, True) and s.norm_topk_prob
    # one expert's slice dequantizes to that expert's weight (gate rows of gate_up_proj)
    want = dequantized_like(hf, "Q8_0").model.layers[0].mlp.experts.gate_up_proj[3, :i]
    assert torch.equal(g.tensor("blk.0.ffn_gate_exps.weight", 3), want)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0"])
def test_greedy_matches_hf_with_file_weights(hf, qtype, tmp_path, tok_dir):
    """fp32 verification mode: 32 greedy tokens equal transformers' on the file's weights."""
    path = _write(tmp_path, hf, qtype, tok_dir)
    ref = dequantized_like(hf, qtype)
    eng = _engine(path)
    try:
        assert eng.spec.family == "qwen3_moe" and eng.files.gguf is not None
        r = eng.complete(PROMPT, GenerationConfig(max_tokens=TOKENS, stop_token_ids=()))
        assert r.token_ids == greedy(ref, PROMPT, TOKENS), qtype
        eng.decoder.reset()
        diff = (eng.decoder.forward(PROMPT) - hf_logits(ref, PROMPT)[-1]).abs().max().item()
        assert diff < 1e-4, f"{qtype}: logits differ by {diff}"
    finally:
        eng.close()


def test_transformers_reads_the_same_file(hf, tmp_path, tok_dir):
    """transformers' GGUF tensor reader (modeling_gguf_pytorch_utils, Qwen2MoeTensorProcessor)
    rebuilds the original weights from our F32 file: the layout is the one it reads from real
    llama.cpp files. The config is passed: transformers 5.25 maps no expert_feed_forward_length
    (its default moe_intermediate_size 768 is Qwen3-30B-A3B's) and takes the vocabulary size
    from the token list."""
    from transformers import AutoModelForCausalLM
    path = _write(tmp_path, hf, "F32", tok_dir)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, config=hf.config,
                                                attn_implementation="eager").eval()
    sd, want = back.state_dict(), hf.state_dict()
    for name, w in want.items():
        assert torch.equal(sd[name], w), name


def test_native_q8_0_experts_exact(hf, tmp_path, tok_dir):
    """precision native on a Q8_0 file: experts (and attention, head) as int8 g32 with the
    file's q bit for bit, expert e's gate rows then its up rows."""
    import gguf
    from gguf.quants import quantize
    from torch_xdna.engine.llm.gguf_weights import native_transform
    from torch_xdna.models.loader import load_weights
    path = _write(tmp_path, hf, "Q8_0", tok_dir)
    eng = _engine(path, "native")
    try:
        pol = eng.decoder.policy
        assert (pol.attention, pol.mlp, pol.head, pol.group) == ("int8", "int8", "int8", 32)
        files = eng.files
        tf = native_transform(files.gguf, files.config, pol, files.spec,
                              pol.transform_for(files.spec))
        stored = load_weights(files, tf, "t", None, quiet=True)
        i = hf.config.moe_intermediate_size
        gu = hf.model.layers[1].mlp.experts.gate_up_proj.detach().numpy()     # [E, 2I, H]
        blocks = quantize(gu, gguf.GGMLQuantizationType.Q8_0).reshape(8, 2 * i, -1, 34)
        want = blocks[..., 2:].copy().view(np.int8).reshape(8 * 2 * i, -1)
        assert torch.equal(stored["layers.1.experts_gate_up"][0], torch.from_numpy(want))
        assert "q values exact" in " ".join(files.gguf.notes)
        r = eng.complete(PROMPT, GenerationConfig(max_tokens=4, stop_token_ids=()))
        assert len(r.token_ids) == 4
    finally:
        eng.close()


def test_unsupported_moe_metadata_refused_by_name(hf, tmp_path, tok_dir):
    from gguf import ExpertGatingFuncType
    for meta, word in (({"expert_gating_func": ExpertGatingFuncType.SIGMOID}, "expert_gating_func"),
                       ({"expert_shared_count": 1}, "expert_shared_count")):
        d = tmp_path / word
        d.mkdir()
        with pytest.raises(ModelDirError, match=word):
            _engine(_write(d, hf, "F16", tok_dir, **meta))


def test_cli_generate_and_openai_client(hf, tmp_path, tok_dir, capsys, monkeypatch):
    """`xdna generate FILE.gguf` and `xdna serve --model FILE.gguf` answered through the
    official openai client."""
    import openai
    from torch_xdna.cli.main import main
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path, hf, "Q8_0", tok_dir)
    assert main(["generate", str(path), "the quick", "--max-tokens", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["precision"].startswith("int8") and doc["usage"]["completion_tokens"] == 4
    assert main(["estimate", str(path), "--precision", "int8"]) == 0      # metadata only
    assert "qwen3_moe" in capsys.readouterr().out
    app = create_app(ServerConfig(models=[f"moe={path}"], default_model=False, preload=False))
    with BackgroundServer(app) as srv:
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        assert [m.id for m in oai.models.list().data] == ["moe"]
        r = oai.chat.completions.create(model="moe", max_tokens=3, temperature=0,
                                        messages=[{"role": "user", "content": "hello"}])
        assert r.usage.completion_tokens == 3 and r.choices[0].message.content is not None
