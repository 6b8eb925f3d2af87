"""Long contexts end to end: a 9,000-token prompt through random-weight Qwen3 (YaRN), Llama
(llama3 rope scaling) and Gemma 3 (sliding + full layers) generating identically to
transformers; the int8 KV cache's accuracy; the KV capacity from the memory budget; and
`xdna estimate` at 1K-128K.

Tolerances: fp32 verification mode (nothing rounded) must match transformers' fp32 logits to
1e-4 absolute (logit scale ~1.5; measured ~7e-7) and give the same greedy tokens. int8 KV (one
scale per head and token, kernels/llm_blocks.quantize_kv): logits within 2% of the logit scale
(max |logit|) of transformers in the fp32 mode and of the bf16-KV engine in the NPU's bf16
numerics (measured 0.3-0.8%), and the same argmax.
"""
from __future__ import annotations

import json

import pytest
import torch

from llm_fixtures import build_model, hf_logits
from torch_xdna.engine.llm.decoder import ContextOverflow, ModelTooLarge
from torch_xdna.engine.llm.generate import load_decoder

LONG = 9000
STEPS = 4
SHAPES = dict(max_position_embeddings=16384, hidden_size=32, num_attention_heads=2, head_dim=16,
              num_key_value_heads=1, intermediate_size=64, num_hidden_layers=2)
LONG_CONFIGS = {
    "qwen3": dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                   "original_max_position_embeddings": 4096}),
    "llama": {},                 # llama3 rope scaling (factor 8 over 64 original positions)
    "gemma3": dict(sliding_window=256, layer_types=["sliding_attention", "full_attention"]),
}



@pytest.mark.parametrize("family", list(LONG_CONFIGS))
def test_9000_token_prompt_generates_like_transformers(family, tmp_path, one_thread):
    hf = build_model(family, tmp_path, attn="sdpa", **SHAPES, **LONG_CONFIGS[family])
    ids = torch.randint(5, 400, (LONG,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=STEPS, do_sample=False,
                          eos_token_id=None, pad_token_id=0, min_new_tokens=STEPS,
                          output_logits=True, return_dict_in_generate=True)
    want = out.sequences[0, LONG:].tolist()
    eng = load_decoder(tmp_path, "fp32", prefill_chunk=512, quiet=True, cache_dir=False)
    try:
        dec = eng.decoder
        assert dec.capacity == 16384            # the model's maximum: the budget allows it
        logits = dec.forward(ids)              # chunked prefill: 18 chunks of <= 512 rows
        assert (logits - out.logits[0][0]).abs().max().item() < 1e-4, family
        got = []
        for _ in range(STEPS):
            got.append(int(logits.argmax()))
            logits = dec.forward([got[-1]])
        assert got == want, family
    finally:
        eng.close()


@pytest.mark.parametrize("family", ("qwen3", "llama", "gemma3"))
def test_int8_kv_cache_within_tolerance(family, tmp_path, one_thread):
    hf = build_model(family, tmp_path)
    ids = torch.randint(5, 400, (500,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = hf_logits(hf, ids)[-1]
    scale = ref.abs().max().item()
    got = {}
    for kv in ("bf16", "int8"):
        for precision in ("fp32", "bf16"):
            eng = load_decoder(tmp_path, precision, max_context=512, prefill_chunk=128,
                               quiet=True, cache_dir=False, kv_dtype=kv)
            got[kv, precision] = eng.decoder.forward(ids)
            if kv == "int8":
                assert eng.decoder.cache.k[0].dtype == torch.int8
            eng.close()
    i8 = got["int8", "fp32"]
    assert 0 < (i8 - ref).abs().max().item() <= 0.02 * scale
    diff = (got["int8", "bf16"] - got["bf16", "bf16"]).abs().max().item()
    assert diff <= 0.02 * scale
    assert int(got["int8", "bf16"].argmax()) == int(got["bf16", "bf16"].argmax())


def test_capacity_from_budget_and_errors_name_it(tmp_path):
    from torch_xdna.engine.llm.decoder import per_token_bytes, resident_bytes_estimate
    from torch_xdna.engine.llm.decoder import PrecisionPolicy
    from torch_xdna.hw import NPU4
    from torch_xdna.models.loader import read_model
    from torch_xdna.runtime.sim import SimDevice
    build_model("qwen3", tmp_path, **SHAPES)
    spec = read_model(tmp_path).spec
    policy = PrecisionPolicy.parse("bf16")
    fixed = resident_bytes_estimate(spec, policy, 0, 128)
    per = per_token_bytes(spec, policy)
    # a budget whose half-after-weights holds 2,000 tokens: the default capacity is 1920
    dev = SimDevice(NPU4, fixed + 4000 * per)
    eng = load_decoder(tmp_path, "bf16", quiet=True, cache_dir=False, device=dev)
    assert eng.decoder.capacity == 1920
    with pytest.raises(ContextOverflow, match="1920"):
        eng.generate(list(range(5, 5 + 1920)))
    eng.close()
    # int8 KV: fewer bytes per token, so the same budget holds a longer default context
    eng = load_decoder(tmp_path, "bf16", quiet=True, cache_dir=False, device=dev, kv_dtype="int8")
    assert eng.decoder.capacity > 1920
    eng.close()
    with pytest.raises(ModelTooLarge, match="TORCH_XDNA_MEMORY_BUDGET") as e:
        load_decoder(tmp_path, "bf16", quiet=True, cache_dir=False, device=dev,
                     max_context=16000)
    assert "holds at most" in str(e.value) and "--kv-dtype int8" in str(e.value)


def test_cli_estimate_by_context_to_128k(capsys):
    from torch_xdna.cli.main import main
    for name in ("qwen3-0.6b", "llama-3.2-1b", "gemma-3-1b"):
        assert main(["estimate", name, "--precision", "int4",
                     "--context", "1k,4k,32k,128k", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)["results"]
        assert [r["context"] for r in rows] == [1024 * k for k in (1, 4, 32, 128)]
        dec = [r["modeled_decode_tok_s"] for r in rows]
        assert all(a >= b for a, b in zip(dec, dec[1:])) and dec[-1] > 0, name
        assert all(r["mb_per_token"] > 0 and r["floor_ratio"] >= 1.0 for r in rows)
        assert all(r["modeled_prefill_tok_s"] > 0 for r in rows)
        assert rows[-1]["beyond_model_max"] == (name != "llama-3.2-1b")
    assert main(["estimate", "llama-3.2-1b", "--precision", "int4", "--context", "4k,32k"]) == 0
    text = capsys.readouterr().out
    assert "prefill tok/s" in text and "32768" in text and "MB/tok" in text


def test_generate_flags_and_server_context_limit(tmp_path, capsys):
    from torch_xdna.cli.main import main
    from torch_xdna.server.registry import ModelRegistry
    build_model("llama", tmp_path)
    assert main(["generate", str(tmp_path), "the quick brown fox", "--max-tokens", "3",
                 "--max-context", "200", "--kv-dtype", "int8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["usage"]["completion_tokens"] == 3
    reg = ModelRegistry(max_context=160)
    entry = reg.add_dir(tmp_path, "chat")
    model = reg.get(entry)
    assert model.context_length == 160                   # the server's per-model limit
    assert reg.get(reg.add_dir(tmp_path, "chat-i8", max_context=96,
                               kv_dtype="int8")).context_length == 96
    reg.close_all()


def test_prefill_chunk_sized_by_the_plan():
    """A chunk whose activations would not fit the mem tiles is halved until it plans."""
    from torch_xdna.engine.llm.decoder import PrecisionPolicy, plan_chunk
    from torch_xdna.hw import NPU4
    from torch_xdna.models.families import BUILTIN_CONFIGS, spec_from_config
    spec = spec_from_config(BUILTIN_CONFIGS["llama-3.2-1b"])      # MLP rows 8192 wide
    policy = PrecisionPolicy.parse("int4")
    staged = NPU4.memtile_bytes.value * NPU4.columns.value // (2 * spec.intermediate)
    assert plan_chunk(spec, policy, 32768, 4096, NPU4) == staged == 256
    assert plan_chunk(spec, policy, 32768, 128, NPU4) == 128
