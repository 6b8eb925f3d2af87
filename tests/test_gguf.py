"""GGUF loading: files written by gguf's GGUFWriter from tiny random HF models (tests/gguf_fixtures
.py, following llama.cpp's convert_hf_to_gguf.py) decode the same greedy tokens as the HF model
holding the same (for quantized files: dequantized) weights, in fp32 verification mode; Q8_0/Q4_0
blocks map onto int8/int4 g32 with q exact; Q4_K_M is dequantized and says so; the tokenizer and
chat template rebuilt from tokenizer.ggml.* match the original tokenizer; broken files are
refused by name; `xdna generate FILE.gguf` and the server registry accept a file."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gguf_fixtures import (add_gpt2_tokenizer, add_spm_tokenizer, dequantized_like,
                           spm_tokenizer_dir, write_gguf)
from gguf_fixtures import greedy as _greedy, random_model
from llm_fixtures import CHAT_TEMPLATE, TEXT, VOCAB, _config, hf_logits, save_tokenizer
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.kernels.quant import unpack_int4
from torch_xdna.models.formats.gguf import open_gguf
from torch_xdna.models.hf import ModelDirError

PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]
SAMPLES = ["the quick brown fox", "hello world! how are you today?", "  two  spaces ",
           "numbers 0 1 2 3 and punctuation ; : ?", "unseen wörds ünïcode 東京", ""]


def _gemma_config():
    from transformers import Gemma3TextConfig
    # what a GGUF can express: llama.cpp's gemma3 defaults (pattern 6, local base 1e4,
    # query scale 1/sqrt(head_dim), no soft-capping)
    return Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, head_dim=16, num_hidden_layers=6,
        num_key_value_heads=1, intermediate_size=128, sliding_window=8, query_pre_attn_scalar=16,
        final_logit_softcapping=None, max_position_embeddings=512, rms_norm_eps=1e-6,
        initializer_range=0.08, bos_token_id=2, eos_token_id=1, pad_token_id=0,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})


def _hf_model(family: str, seed: int = 0, **over):
    cfg = _gemma_config() if family == "gemma3" else _config(family)
    for k, v in over.items():
        setattr(cfg, k, v)
    return random_model(cfg, seed)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe-tok")
    save_tokenizer(d)
    return d


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    return spm_tokenizer_dir(tmp_path_factory.mktemp("spm-tok"), TEXT, VOCAB)


@pytest.fixture(scope="module")
def models():
    return {f: _hf_model(f) for f in ("qwen3", "llama", "gemma3")}


def _write(tmp_path, family, model, qtype, tok_dir, spm_dir, pre="qwen2"):
    if family == "gemma3":
        def tok(w):
            add_spm_tokenizer(w, spm_dir, CHAT_TEMPLATE)
    else:
        def tok(w):
            add_gpt2_tokenizer(w, tok_dir, pre)
    return write_gguf(model, family, tmp_path / f"{family}-{qtype}.gguf", qtype, tok)


def _engine(path, precision="fp32", **kw):
    return load_decoder(path, precision, max_context=64, prefill_chunk=8, quiet=True,
                        cache_dir=False, **kw)


# every family in F16; BF16 and the two block types once each (the same dequantizing path)
CASES = [("qwen3", "F16"), ("llama", "F16"), ("gemma3", "F16"), ("llama", "BF16"),
         ("llama", "Q8_0"), ("qwen3", "Q4_0")]


@pytest.mark.parametrize("family,qtype", CASES)
def test_greedy_matches_hf_with_file_weights(models, family, qtype, tmp_path, tok_dir, spm_dir):
    """fp32 verification mode: the file's weights, dequantized, decode exactly like the HF model
    given the same values (F16/BF16: the rounded weights; Q8_0/Q4_0: gguf.quants' dequantized)."""
    path = _write(tmp_path, family, models[family], qtype, tok_dir, spm_dir)
    ref = dequantized_like(models[family], qtype)
    eng = _engine(path)
    try:
        assert eng.spec.family == family and eng.files.gguf is not None
        r = eng.complete(PROMPT, GenerationConfig(max_tokens=8, stop_token_ids=()))
        assert r.token_ids == _greedy(ref, PROMPT, 8), (family, qtype)
        got = eng.decoder
        got.reset()
        diff = (got.forward(PROMPT) - hf_logits(ref, PROMPT)[-1]).abs().max().item()
        assert diff < 1e-4, f"{family}/{qtype}: logits differ by {diff}"
    finally:
        eng.close()


@pytest.mark.parametrize("qtype,prec", (("Q8_0", "int8"), ("Q4_0", "int4")))
def test_native_blocks_map_exactly(models, qtype, prec, tmp_path, tok_dir, spm_dir):
    """precision native: Q8_0 -> int8 g32, Q4_0 -> int4 g32 with the file's q values bit for bit;
    logits within the fake-quantization tolerance of the dequantized HF reference."""
    import gguf
    from gguf.quants import quantize
    hf = models["llama"]
    path = _write(tmp_path, "llama", hf, qtype, tok_dir, spm_dir, pre="llama-bpe")
    eng = _engine(path, "native")
    try:
        pol = eng.decoder.policy
        assert (pol.attention, pol.mlp, pol.head, pol.group) == (prec, prec, prec, 32)
        notes = " ".join(eng.files.gguf.notes)
        assert "q values exact" in notes and "bf16" in notes
        # the stored q of layer 0's down projection are gguf's own q (down: not permuted)
        w = hf.model.layers[0].mlp.down_proj.weight.detach().numpy()
        blocks = quantize(w, gguf.GGMLQuantizationType[qtype]).reshape(w.shape[0], -1, 34 if
                                                                        prec == "int8" else 18)
        if prec == "int8":
            want = blocks[..., 2:].copy().view(np.int8).reshape(w.shape)
        else:
            qs = blocks[..., 2:]
            want = (np.concatenate([qs & 15, qs >> 4], -1).astype(np.int8) - 8).reshape(w.shape)
        from torch_xdna.engine.llm.gguf_weights import native_transform  # noqa: F401 (the path used)
        stored = _stored_site(eng, "layers.0.down")
        q = stored[0] if prec == "int8" else unpack_int4(stored[0])
        assert torch.equal(q, torch.from_numpy(want))
        ref = dequantized_like(hf, qtype)
        ids = PROMPT + [200, 150]
        ref_logits = hf_logits(ref, ids)
        scale = ref_logits.abs().max().item()
        eng.decoder.reset()
        got = eng.decoder.forward(ids)
        assert (got - ref_logits[-1]).abs().max().item() < 0.05 * scale
    finally:
        eng.close()


def _stored_site(eng, site: str) -> tuple[torch.Tensor, ...]:
    """The host tensors the engine stored for `site` (reloaded through the loader)."""
    from torch_xdna.engine.llm.gguf_weights import native_transform
    from torch_xdna.models.loader import load_weights
    files, pol = eng.files, eng.decoder.policy
    tf = native_transform(files.gguf, files.config, pol, files.spec, pol.transform_for(files.spec))
    return load_weights(files, tf, "t", None, quiet=True)[site]


def test_q4_k_m_dequantized_and_said(tmp_path, tok_dir, spm_dir):
    hf = _hf_model("qwen3", hidden_size=256, intermediate_size=512, head_dim=64,
                   num_hidden_layers=1)
    path = _write(tmp_path, "qwen3", hf, "Q4_K_M", tok_dir, spm_dir)
    g = open_gguf(path)
    assert g.tensor_type("blk.0.ffn_up.weight") == "Q4_K"
    eng = _engine(path)
    try:
        assert any("Q4_K" in n and "dequantized" in n for n in eng.files.gguf.notes)
        ref = dequantized_like(hf, "Q4_K_M")
        # our Q4_K encoder is a faithful format writer: its dequantized weights stay close
        err = (ref.model.layers[0].mlp.up_proj.weight - hf.model.layers[0].mlp.up_proj.weight)
        assert err.abs().max() < 0.1 * hf.model.layers[0].mlp.up_proj.weight.abs().max()
        r = eng.complete(PROMPT, GenerationConfig(max_tokens=8, stop_token_ids=()))
        assert r.token_ids == _greedy(ref, PROMPT, 8)
    finally:
        eng.close()
    auto = _engine(path, "native")
    assert auto.decoder.policy.mlp == "bf16"           # no exact format: bf16 after dequantizing
    auto.close()


@pytest.mark.parametrize("pre", ("qwen2", "llama-bpe", "gpt-2"))
def test_gpt2_tokenizer_and_template_rebuilt(models, tmp_path, tok_dir, spm_dir, pre):
    from tokenizers import Tokenizer
    from torch_xdna.models.formats.gguf import gguf_tokenizer
    from torch_xdna.models.tokenizer import Tokenizer as DirTokenizer
    path = _write(tmp_path, "qwen3", models["qwen3"], "F16", tok_dir, spm_dir, pre)
    tok = gguf_tokenizer(open_gguf(path))
    if pre == "gpt-2":                   # the vocabulary was trained with GPT-2's split
        orig = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        want = lambda s: orig.encode(s).ids                  # noqa: E731
    else:                                # other splits: transformers' own GGUF tokenizer rebuild
        want = _transformers_gguf_tokenizer(path).encode    # (integrations/gguf)
    for s in SAMPLES + ["<|im_start|>user\nhi<|im_end|>", "digits 12345 and 'll 've"]:
        assert tok.encode(s) == want(s), (pre, s)
        assert tok.decode(tok.encode(s), skip_special_tokens=False) == s
    msgs = [{"role": "user", "content": "hello"}]
    assert tok.apply_chat_template(msgs) == DirTokenizer(tok_dir).apply_chat_template(msgs)
    assert tok.eos_token == "<eos>"


def test_spm_tokenizer_rebuilt(models, tmp_path, tok_dir, spm_dir):
    from tokenizers import Tokenizer
    from torch_xdna.models.formats.gguf import gguf_tokenizer
    path = _write(tmp_path, "gemma3", models["gemma3"], "F16", tok_dir, spm_dir)
    tok = gguf_tokenizer(open_gguf(path))
    orig = Tokenizer.from_file(str(spm_dir / "tokenizer.json"))
    bos = orig.token_to_id("<bos>")
    hf = _transformers_gguf_tokenizer(path)
    for s in SAMPLES:
        assert tok.encode(s) == [bos] + orig.encode(s).ids, s        # add_bos_token
        assert tok.encode(s) == hf.encode(s), s
        assert tok.decode(tok.encode(s)) == s
    assert tok.encode("<start_of_turn>", add_special_tokens=False) == [
        orig.token_to_id("<start_of_turn>")]


def _transformers_gguf_tokenizer(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_unsupported_tokenizer_names_the_fix(models, tmp_path, tok_dir, spm_dir):
    def tok(w):
        w.add_tokenizer_model("bert")
        w.add_token_list(["[PAD]", "a"])
    path = write_gguf(models["qwen3"], "qwen3", tmp_path / "bert-tok.gguf", "F16", tok)
    with pytest.raises(ModelDirError, match="--tokenizer DIR"):
        _engine(path)
    eng = _engine(path, tokenizer_dir=tok_dir)           # the fix works
    assert eng.tokenizer.encode("hello") == eng.tokenizer.tok.encode("hello").ids
    eng.close()


def test_corrupt_and_truncated_files(models, tmp_path, tok_dir, spm_dir):
    path = _write(tmp_path, "qwen3", models["qwen3"], "Q8_0", tok_dir, spm_dir)
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:len(data) - 4096])
    with pytest.raises(ModelDirError, match="truncated"):
        _engine(cut)
    header = tmp_path / "header.gguf"
    header.write_bytes(data[:200])
    with pytest.raises(ModelDirError, match="corrupt or truncated|truncated"):
        _engine(header)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(ModelDirError, match="header.gguf|bad.gguf"):
        _engine(bad)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelDirError, match="no 'GGUF' magic"):
        _engine(junk)


def test_cli_generate_and_registry(models, tmp_path, tok_dir, spm_dir, capsys, monkeypatch):
    from torch_xdna.cli.main import main
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path / "cache"))     # a fresh weight cache
    from torch_xdna.server.registry import ModelRegistry
    path = _write(tmp_path, "qwen3", models["qwen3"], "Q8_0", tok_dir, spm_dir)
    assert main(["generate", str(path), "the quick", "--max-tokens", "4", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["precision"].startswith("int8") and doc["usage"]["completion_tokens"] == 4
    assert "q values exact" in out.err
    assert main(["generate", str(path), "the quick", "--max-tokens", "4", "--json"]) == 0
    assert "weight cache" in capsys.readouterr().err           # second run: the cached sites
    assert main(["estimate", str(path), "--precision", "int8"]) == 0   # metadata only
    assert "qwen3" in capsys.readouterr().out
    reg = ModelRegistry()
    entry = reg.add_dir(path)
    assert entry.kind == "chat" and entry.id == "qwen3-Q8_0"


def test_serve_gguf_file(models, tmp_path, tok_dir, spm_dir, monkeypatch):
    """`xdna serve --model FILE.gguf`: the file is offered as a chat model and answers."""
    from fastapi.testclient import TestClient
    from torch_xdna.server.app import ServerConfig, create_app
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path / "cache"))
    path = _write(tmp_path, "qwen3", models["qwen3"], "Q4_0", tok_dir, spm_dir)
    cfg = ServerConfig(models=[f"tiny={path}"], default_model=False, preload=False)
    with TestClient(create_app(cfg)) as c:
        assert [m["id"] for m in c.get("/v1/models").json()["data"]] == ["tiny"]
        r = c.post("/v1/chat/completions", json={
            "model": "tiny", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3
