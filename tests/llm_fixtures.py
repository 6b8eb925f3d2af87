"""Tiny random-weight Qwen3 / Llama / Gemma 3 / Qwen3-MoE / gpt-oss / OPT / Qwen3.5 directories for the LLM engine tests.

Built with transformers (test-only reference) and saved with save_pretrained (safetensors), plus a
byte-level BPE tokenizer trained locally on a small text and a chat template. Nothing downloads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 400
TEXT = ("the quick brown fox jumps over the lazy dog. a small model runs on the npu and "
        "streams text one token at a time. hello world! how are you today? i am fine, thanks. "
        "numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ; : ? ! are tokens too. ") * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]


def save_tokenizer(path: Path, specials: list[str] = SPECIALS, config: dict | None = None) -> None:
    """A byte-level BPE trained on TEXT (special tokens first, ids 0..) and its tokenizer_config
    (default: <bos>/<eos>/<pad> and CHAT_TEMPLATE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 20, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(config or {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}))


def _config(family: str, **overrides):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config
    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.08,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if overrides:
        cfg = _config(family)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        return cfg
    if family == "qwen3":
        return Qwen3Config(intermediate_size=128, num_hidden_layers=2, num_key_value_heads=2,
                           tie_word_embeddings=True,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)
    if family == "llama":
        return LlamaConfig(intermediate_size=160, num_hidden_layers=3, num_key_value_heads=2,
                           tie_word_embeddings=False,
                           rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 50000.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 64}, **common)
    if family == "qwen3_moe":          # 8 experts, 2 per token; layer 1 keeps the dense MLP
        from transformers import Qwen3MoeConfig
        return Qwen3MoeConfig(intermediate_size=128, moe_intermediate_size=32, num_experts=8,
                              num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                              num_hidden_layers=3, num_key_value_heads=2, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                              **common)
    if family == "gpt_oss":            # 8 experts, 2 per token; sliding 8 / full; YaRN; sinks
        from transformers import GptOssConfig
        return GptOssConfig(
            intermediate_size=64, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=4,
            num_key_value_heads=2, sliding_window=8, attention_bias=True, tie_word_embeddings=False,
            layer_types=["sliding_attention", "full_attention"] * 2, swiglu_limit=0.75,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 128,
                             "rope_theta": 150000.0}, **common)
    if family == "qwen3_5":            # hybrid: 3 gated DeltaNet layers, then gated attention
        from transformers import Qwen3_5TextConfig
        return Qwen3_5TextConfig(
            intermediate_size=128, num_hidden_layers=4, num_key_value_heads=2,
            layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
            linear_conv_kernel_dim=4, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}, **common)
    if family == "opt":                # learned positions, pre-LayerNorm, ReLU MLP, biases
        from transformers import OPTConfig
        return OPTConfig(ffn_dim=128, num_hidden_layers=2, word_embed_proj_dim=64,
                         **{k: v for k, v in common.items() if k not in ("head_dim", "rms_norm_eps")})
    if family == "gemma3":
        return Gemma3TextConfig(
            intermediate_size=128, num_hidden_layers=4, num_key_value_heads=1,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
            query_pre_attn_scalar=24, final_logit_softcapping=30.0, tie_word_embeddings=True,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
            **common)
    raise ValueError(family)


def build_model(family: str, path: Path, seed: int = 0, attn: str = "eager", **overrides):
    """Save a tiny random `family` model to `path`; returns the fp32 HF model (eval mode).
    overrides: config attributes to replace (e.g. the long-context tests' shapes)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_config(family, **overrides), attn_implementation=attn)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:                 # non-trivial norm weights exercise (1+w) vs w
                p.add_(torch.randn_like(p) * 0.2)
            elif family == "gpt_oss" and name.endswith(("_bias", "sinks")):   # zero-initialized
                p.add_(torch.randn_like(p) * 0.5)
    model = model.float().eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(path)
    return model


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """fp32 logits [len(ids), V] of the HF reference model."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=n)
    return out[0, len(ids):].tolist()


def teacher_forced(engine, ids: list[int], split: int) -> list[torch.Tensor]:
    """Engine logits after prefilling ids[:split], then after each following token."""
    dec = engine.decoder
    dec.reset()
    out = [dec.forward(ids[:split])]
    for t in ids[split:]:
        out.append(dec.forward([t]))
    return out


def check_against_transformers(engine, model, prompt: list[int], tol: float,
                               extra: tuple[int, ...] = (200, 150, 9, 31)) -> None:
    """Teacher-forced logits of prompt + extra within `tol` x the logit scale of the fp32 HF
    model (tol=None: within 1e-4, the fp32 verification mode; else they must also differ)."""
    ids = list(prompt) + list(extra)
    ref = hf_logits(model, ids)
    scale = ref.abs().max().item()
    for j, g in enumerate(teacher_forced(engine, ids, len(prompt))):
        diff = (g - ref[len(prompt) - 1 + j]).abs().max().item()
        if tol is None:
            assert diff < 1e-4, f"step {j}: max |diff| {diff}"
        else:
            assert 0 < diff < tol * scale, f"step {j}: {diff} vs logit scale {scale}"


def check_greedy_identical(engine, model, prompt: list[int], n: int = 32) -> None:
    """fp32 mode: n greedy tokens identical to transformers', one dispatch and one launch per
    layer (+ embed + head) per token."""
    from torch_xdna.engine.llm.generate import GenerationConfig
    r = engine.complete(prompt, GenerationConfig(max_tokens=n, stop_token_ids=()))
    assert r.token_ids == hf_greedy(model, prompt, n)
    assert r.stats.dispatches_per_token == 1.0
    assert r.stats.launches_per_token == model.config.num_hidden_layers + 2


def fake_quantized(model, engine, precision: str):
    """A copy of the fp32 HF `model` whose matmul weights hold the values the engine's quantized
    weights dequantize to (same group sizes per block kind); what stays float in the engine
    (MoE router, learned positions, norms, convs) stays float here."""
    from torch_xdna.engine.llm.quantize import quantize
    from torch_xdna.kernels.blocks.weights import dequantize
    fake = type(model)(model.config).eval()
    fake.load_state_dict(model.state_dict())
    policy, spec = engine.decoder.policy, engine.spec
    with torch.no_grad():
        for name, p in fake.named_parameters():
            if p.dim() != 2 or name.endswith(("mlp.gate.weight", "embed_positions.weight")):
                continue
            kind = ("mlp" if ".mlp." in name or ".fc" in name else
                    "attention" if "_attn." in name else "head")
            g = policy.block_group(spec, kind)
            p.copy_(dequantize(quantize(p, precision, g), precision, g))
    return fake


def served_answers(path: Path, msgs: list[dict], clients: int = 3, max_tokens: int = 6
                   ) -> dict[str, list[str] | str]:
    """Greedy answers to `msgs` from `xdna serve`'s routes on the directory, through the
    official clients: `clients` simultaneous OpenAI chats, one streamed OpenAI chat, and
    Ollama's /api/chat."""
    import concurrent.futures

    import ollama
    import openai
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    reg = ModelRegistry(max_models=2)
    name = reg.add_dir(path).id
    with BackgroundServer(create_app(ServerConfig(default_model=False), registry=reg)) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)

        def chat(_):
            return client.chat.completions.create(model=name, messages=msgs, max_tokens=max_tokens,
                                                  temperature=0).choices[0].message.content
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            openai_answers = list(pool.map(chat, range(clients)))
        stream = client.chat.completions.create(model=name, messages=msgs, max_tokens=max_tokens,
                                                temperature=0, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        o = ollama.Client(host=srv.url).chat(model=name, messages=msgs,
                                              options={"num_predict": max_tokens, "temperature": 0})
    return {"openai": openai_answers, "stream": streamed, "ollama": o.message.content}


def decode_charged(engine, prompt: list[int]) -> tuple[int, dict]:
    """(DRAM bytes the simulator charged one decode token after `prompt`, the same step
    modeled from shapes alone by estimate_step): a MoE decode token hits exactly top_k experts,
    so the two must agree byte for byte."""
    from torch_xdna.engine.llm.decoder import estimate_step
    from torch_xdna.runtime.sim.cost import CostModel
    dec = engine.decoder
    dec.reset()
    dec.forward(prompt)
    before = dec.dev.counters.dram_bytes
    dec.forward([9])
    got = dec.dev.counters.dram_bytes - before
    return got, estimate_step(engine.spec, dec.policy, CostModel(dec.dev.gen), 1, len(prompt), 1,
                              dec.capacity, True)


def prefill_hits(monkeypatch, engine, model, ids: list[int]) -> tuple[list, list]:
    """(what the simulator charged each MoE launch of one prefill chunk of `ids`: (valid rows,
    distinct experts), transformers' distinct experts per MoE layer for the same rows: top-k
    of its router logits, which is the same set whether the softmax runs before the top-k or
    after it)."""
    from torch_xdna.kernels.blocks.moe import MoeBlockDesign
    charged: list[tuple[int, int]] = []
    orig = MoeBlockDesign.routed_plan

    def spy(self, gen, outs, n=None, **kw):
        plan = orig(self, gen, outs, n=n, **kw)
        charged.append((n, plan.notes["experts_hit"]))
        return plan
    monkeypatch.setattr(MoeBlockDesign, "routed_plan", spy)
    engine.decoder.reset()
    engine.decoder.forward(ids)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_router_logits=True)
    k = model.config.num_experts_per_tok
    want = [int(torch.unique(torch.topk(lg.float(), k, -1).indices).numel())
            for lg in out.router_logits]
    return charged, want


def copy_without(src: Path, dst: Path, tensor: str) -> Path:
    """A copy of model directory `src` at `dst` whose model.safetensors lacks `tensor` (the
    loaders must refuse it naming the tensor)."""
    import shutil
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    del sd[tensor]
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def batched_and_alone(eng, prompts: list, cfg) -> tuple[list, list]:
    """(token ids of `prompts` decoded together in one BatchSession, each decoded alone)."""
    from torch_xdna.engine.llm.batching import BatchSession
    alone = [eng.complete(p, cfg).token_ids for p in prompts]
    with BatchSession(eng, slots=len(prompts)) as session:
        seqs = [session.add(p, cfg) for p in prompts]
        session.run()
    return [s.token_ids for s in seqs], alone
