"""Gemma 4 text decoders (E2B/E4B structure) on the decoder rail, against transformers 5.25.

Random-weight directories from transformers configs with small dims but Gemma 4's structure:
sliding and full-attention layers of different head dims (16 / 32, like E2B's 256 / 512) with
proportional RoPE on the full layers, the last 3 of 6 layers reusing earlier layers' KV
(num_kv_shared_layers) with double-wide MLPs, per-layer inputs (PLE), per-layer output
scalars, value norms, final logit soft-capping. Norm weights and layer scalars are perturbed so
the plain-w RMSNorm and the scalars are exercised. The main directory is the multimodal
Gemma4ForConditionalGeneration checkpoint (with a tiny vision tower, which is ignored); the
text-only gemma4_text directory is checked too. fp32 verification mode: logits within 1e-4 and
32 greedy tokens identical to transformers over a prompt longer than the sliding window.
"""
from __future__ import annotations

import json

import pytest
import torch

from llm_fixtures import check_against_transformers, hf_greedy, save_tokenizer, served_answers
from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.models.spec import UnsupportedModelError

TEXT = dict(
    vocab_size=400, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
    sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    num_kv_shared_layers=3, hidden_size_per_layer_input=8, vocab_size_per_layer_input=400,
    use_double_wide_mlp=True, final_logit_softcapping=30.0, max_position_embeddings=512,
    initializer_range=0.08, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1e6}})
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, head_dim=16)
PROMPT = torch.randint(5, 390, (20,), generator=torch.Generator().manual_seed(3)).tolist()


def build_gemma4(path, multimodal: bool, **text):
    """Save a tiny random Gemma 4 (multimodal or text-only) to `path`; the fp32 HF model."""
    from transformers import (AutoModelForCausalLM, Gemma4Config, Gemma4ForConditionalGeneration,
                              Gemma4TextConfig)
    torch.manual_seed(0)
    cfg = {**TEXT, **text}
    if multimodal:
        model = Gemma4ForConditionalGeneration(Gemma4Config(
            text_config=cfg, vision_config=VISION, audio_config=None))
    else:
        model = AutoModelForCausalLM.from_config(Gemma4TextConfig(**cfg))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand_like(b) + 0.5)
    model = model.float().eval()
    model.save_pretrained(path)
    save_tokenizer(path)
    return model


@pytest.fixture(scope="module")
def multimodal(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma4")
    return path, build_gemma4(path, True)


def test_spec_reads_gemma4_structure(multimodal):
    path, _ = multimodal
    _, spec = resolve_spec(str(path))
    assert spec.family == "gemma4" and spec.layer_head_dims == (16, 16, 32) * 2
    assert spec.kv_source == (0, 1, 2, 1, 1, 2) and spec.cache_layers == (0, 1, 2)
    assert spec.layer_intermediate == (96,) * 3 + (192,) * 3
    assert spec.ropes["global"].type == "proportional" and spec.attn_scale == 1.0
    assert spec.norm_offset == 0.0 and spec.per_layer_dim == 8 and spec.final_softcap == 30.0


@pytest.mark.parametrize("chunk", [128, 8])
def test_multimodal_dir_greedy_identical_to_transformers(multimodal, chunk):
    """The text part of a Gemma4ForConditionalGeneration directory (vision tower ignored):
    teacher-forced logits within 1e-4, then 32 greedy tokens identical, one dispatch and one
    launch per layer (+ embed + head) per token; prefill in one chunk or in 8-row chunks."""
    path, hf = multimodal
    eng = load_decoder(path, "fp32", max_context=96, prefill_chunk=chunk, quiet=True,
                       cache_dir=False)
    assert len(eng.decoder.cache.k) == 3                 # layers 3-5 own no KV
    check_against_transformers(eng, hf, PROMPT, None)
    r = eng.complete(PROMPT, GenerationConfig(max_tokens=32, stop_token_ids=()))
    assert r.token_ids == hf_greedy(hf, PROMPT, 32)
    assert r.stats.dispatches_per_token == 1.0 and r.stats.launches_per_token == 6 + 2
    eng.close()


def test_text_only_dir_matches_transformers(tmp_path):
    """A gemma4_text directory (Gemma4ForCausalLM) shaped like the 31B model: K=V
    full-attention layers with their own KV heads (attention_k_eq_v,
    num_global_key_value_heads), no KV sharing, no per-layer inputs (layer scalars remain)."""
    hf = build_gemma4(tmp_path, False, num_kv_shared_layers=0, attention_k_eq_v=True,
                      num_global_key_value_heads=1, hidden_size_per_layer_input=0)
    eng = load_decoder(tmp_path, "fp32", max_context=64, quiet=True, cache_dir=False)
    assert eng.spec.layer_kv_heads == (2, 2, 1) * 2 and len(eng.decoder.cache.k) == 6
    assert eng.spec.per_layer_dim == 0 and eng.spec.layer_scale
    check_against_transformers(eng, hf, PROMPT[:12], None)
    eng.close()


def stored_reference(model, engine, precision: str):
    """A copy of the fp32 HF `model` holding the weights as the engine stores them: every float
    weight and buffer rounded to bf16 (norms, scalars, tables), and with int4/int8 the matmul
    weights dequantized from the engine's format, with its kinds and group sizes (each layer's
    PLE gate and projection are MLP weights, the PLE table and its projection head weights)."""
    from torch_xdna.engine.llm.quantize import quantize
    from torch_xdna.kernels.blocks.weights import dequantize
    fake = type(model)(model.config).eval()
    fake.load_state_dict(model.state_dict())
    policy, spec = engine.decoder.policy, engine.spec
    with torch.no_grad():
        for name, p in [*fake.named_parameters(), *fake.named_buffers()]:
            if not p.is_floating_point() or "vision" in name:
                continue
            if p.dim() != 2 or precision == "bf16":
                p.copy_(p.bfloat16().float())
                continue
            kind = ("attention" if ".self_attn." in name else
                    "mlp" if ".mlp." in name or ".per_layer_input_gate." in name
                    or ".per_layer_projection." in name else "head")
            g = policy.block_group(spec, kind)
            p.copy_(dequantize(quantize(p, precision, g), precision, g))
    return fake


def test_npu_precisions_within_tolerance(multimodal):
    """NPU precisions: teacher-forced logits near transformers run with the weights the engine
    stores (bf16-rounded; int8/int4 dequantized), so what remains is the engine's bf16 operand
    rounding of activations: within 10% of the logit scale. Attention scale 1 on unit-RMS q and
    k makes this tiny random model sensitive: rounding only its weights to bf16 moves
    transformers' fp32 logits by up to 7% of their scale."""
    path, hf = multimodal
    for precision in ("bf16", "int8", "int4"):
        eng = load_decoder(path, precision, max_context=64, quiet=True, cache_dir=False)
        check_against_transformers(eng, stored_reference(hf, eng, precision), PROMPT[:12], 0.10)
        eng.close()


def test_estimate_gemma4_e2b_shapes():
    """Modeled (never measured): Gemma-4-E2B shapes at int4. 15 layers own a KV cache (20
    reuse one), so the cache per position is theirs; but every layer still reads the KV it
    attends over, so the bytes a token reads grow with the context through all 7 full-attention
    layers (sliding layers read at most their window)."""
    _, spec = resolve_spec("gemma-4-e2b")
    assert spec.layers == 35 and len(spec.cache_layers) == 15
    assert spec.layer_head_dims.count(512) == 7 and 2.2e9 < spec.params() - 262144 * 35 * 256 < 2.4e9
    rows = {c: estimate(spec, "int4", c) for c in (1024, 4096, 32768)}
    grow = rows[32768]["kv_mb_per_token"] - rows[4096]["kv_mb_per_token"]
    full_read = 2 * 7 * spec.kv_heads * 512 * 2                  # K and V, bf16, per position
    assert grow * 1e6 == pytest.approx((32768 - 4096) * full_read, rel=0.02)
    assert rows[1024]["modeled_decode_tok_s"] > rows[32768]["modeled_decode_tok_s"]
    assert rows[1024]["dispatches_per_token"] == 1 and rows[1024]["launches_per_token"] == 37


def test_refused_features_are_named(tmp_path):
    from torch_xdna.models.families import spec_from_config
    base = {"model_type": "gemma4_text", **{k: v for k, v in TEXT.items()
                                             if k != "initializer_range"}}
    with pytest.raises(UnsupportedModelError, match="enable_moe_block"):
        spec_from_config({**base, "enable_moe_block": True, "num_experts": 8, "top_k_experts": 2})
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        spec_from_config({**base, "use_bidirectional_attention": "all"})
    (tmp_path / "config.json").write_text(json.dumps({**base, "per_layer_config": {
        "2": {"head_dim": 32, "sliding_window": 4}}}))
    with pytest.raises(UnsupportedModelError, match="per_layer_config"):
        load_decoder(tmp_path, quiet=True)


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def test_served_with_openai_and_ollama_clients(multimodal, tmp_path):
    """The Gemma 4 directory behind xdna serve's routes, unchanged: the chat template comes from
    its tokenizer_config.json (a Gemma-style turn template here); two concurrent OpenAI chats
    (batched decode declines Gemma 4's per-layer shapes: they run one after the other), a
    streamed one, and Ollama's /api/chat all answer the engine's own greedy text."""
    import shutil
    src, _ = multimodal
    path = tmp_path / "gemma-4-tiny"
    shutil.copytree(src, path)
    tcfg = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**tcfg, "chat_template": GEMMA_TEMPLATE}))
    msgs = [{"role": "user", "content": "hello world"}]
    eng = load_decoder(path, "bf16", quiet=True, cache_dir=False)
    prompt = eng.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    assert prompt.endswith("<start_of_turn>user\nhello world<end_of_turn>\n<start_of_turn>model\n")
    want = eng.complete(msgs, GenerationConfig(max_tokens=6, stop_token_ids=())).text
    eng.close()
    got = served_answers(path, msgs, clients=2)
    assert got == {"openai": [want] * 2, "stream": want, "ollama": want}


def test_prefix_cache_reuse_gives_the_same_tokens(multimodal):
    """A follow-up prompt sharing a 64-token block reuses the cache-owning layers' KV rows (the
    KV-shared layers read them), and generates what a cold prefill does."""
    path, _ = multimodal
    long = torch.randint(5, 390, (70,), generator=torch.Generator().manual_seed(4)).tolist()
    cfg = GenerationConfig(max_tokens=8, stop_token_ids=())
    eng = load_decoder(path, "fp32", max_context=128, quiet=True, cache_dir=False)
    assert eng.prefix_cache is not None
    eng.complete(long, cfg)
    warm = eng.complete(long[:66] + [7, 8, 9], cfg)
    assert eng.prefix_cache.stats.reused_tokens == 64
    eng.prefix_cache.clear()
    assert warm.token_ids == eng.complete(long[:66] + [7, 8, 9], cfg).token_ids
    eng.close()


def test_weights_checked_against_per_layer_shapes(multimodal, tmp_path):
    """The safetensors headers are checked against each layer's own shapes before loading: a
    config whose full-attention head dim disagrees with the weights names the weight."""
    import shutil

    from torch_xdna.models.hf import ModelDirError
    src, _ = multimodal
    shutil.copytree(src, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["text_config"]["per_layer_config"] = {"2": {"head_dim": 64}, "5": {"head_dim": 64}}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirError, match=r"language_model\.layers\.2\.self_attn\.q_proj\.weight"):
        load_decoder(tmp_path / "m", quiet=True)


def test_rope_tables_bit_equal_to_transformers():
    """Sliding (default, head_dim) and full (proportional, global head dim) RoPE tables equal
    transformers' Gemma4TextRotaryEmbedding bit for bit, at E2B's head dims and 32K positions."""
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    from torch_xdna.models.families import BUILTIN_CONFIGS, spec_from_config
    cfg = BUILTIN_CONFIGS["gemma-4-e2b"]
    spec = spec_from_config(cfg)
    hf = Gemma4TextRotaryEmbedding(Gemma4TextConfig(**{k: v for k, v in cfg.items()
                                                       if k != "model_type"}))
    pos = torch.arange(32768)[None]
    for table, layer_type in (("local", "sliding_attention"), ("global", "full_attention")):
        cos, sin = hf(torch.zeros(1, dtype=torch.float32), pos, layer_type)
        ours = spec.ropes[table].tables(spec.rope_dim(table), 32768)
        assert torch.equal(ours[0], cos[0]) and torch.equal(ours[1], sin[0]), table
    assert spec.rope_dim("global") == 512 and spec.rope_dim("local") == 256
