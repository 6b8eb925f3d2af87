"""GGUF files written from tiny random HF models with the gguf package's GGUFWriter, the way
llama.cpp's convert_hf_to_gguf.py writes them (ggml-org/llama.cpp: convert_hf_to_gguf.py
LlamaModel.permute for llama q/k, Gemma3Model.norm_shift, LlamaModel.generate_extra_tensors'
rope_freqs for Llama 3 scaling, 1-D tensors kept F32; tensor names from gguf-py's TensorNameMap).
Qwen3-MoE as convert_hf_to_gguf.py (ggml-org/llama.cpp commit 0024aa74) writes it:
TextModel.set_gguf_parameters' expert_count / expert_used_count, Qwen2MoeModel's
expert_feed_forward_length, each projection of all experts as one 3-D tensor (modify_tensors:
transformers' fused gate_up_proj [E, 2I, H] split into gate [E, I, H] and up, down [E, H, I]),
the router ffn_gate_inp always F32 (prepare_tensors' FFN_GATE_INP rule).

Quantized blocks come from gguf.quants.quantize (Q8_0, Q4_0 are bit-exact with ggml-quants.c);
gguf-py has no Q4_K quantizer, so `quantize_q4_k` encodes the block layout of ggml-common.h
block_q4_K (d, dmin fp16; 8 x 6-bit scale/min packed in 12 bytes; 256 4-bit q) with a simple
min/max fit -- a valid Q4_K encoding, not llama.cpp's error-minimizing search.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

ARCH = {"qwen3": "qwen3", "llama": "llama", "gemma3": "gemma3", "qwen3_moe": "qwen3moe"}
FTYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "BF16": 32, "Q4_K_M": 15}


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute (HF rotate-half rows -> interleaved pairs)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg) -> list[float]:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_type llama3)."""
    rp = cfg.rope_parameters
    base, dim = rp["rope_theta"], cfg.head_dim
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    lo_w, hi_w = old / lo, old / hi
    out = []
    for f in freqs.tolist():
        wl = 2 * math.pi / f
        if wl < hi_w:
            out.append(1.0)
        elif wl > lo_w:
            out.append(factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / factor + s))
    return out


# --- Q4_K encoder (ggml-common.h block_q4_K; layout read back by gguf.quants.Q4_K) ------------
def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """fp32 [N, K] (K % 256 == 0) -> uint8 [N, K/256*144] Q4_K blocks."""
    n, k = w.shape
    x = w.reshape(-1, 8, 32).astype(np.float32)                 # sub-blocks of 32
    mn = np.minimum(x.min(-1), 0.0)
    mx = x.max(-1)
    scale = (mx - mn) / 15.0
    mins = -mn
    sc_all = scale.reshape(-1, 8)
    mi_all = mins.reshape(-1, 8)
    d = (sc_all.max(-1) / 63.0).astype(np.float16)
    dmin = (mi_all.max(-1) / 63.0).astype(np.float16)
    df, dmf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.where(df > 0, sc_all / np.where(df > 0, df, 1), 0)), 0, 63).astype(np.uint8)
    mi = np.clip(np.round(np.where(dmf > 0, mi_all / np.where(dmf > 0, dmf, 1), 0)), 0, 63).astype(np.uint8)
    eff_s = (df * sc)[..., None]
    eff_m = (dmf * mi)[..., None]
    xb = x.reshape(-1, 8, 32)
    q = np.clip(np.round(np.where(eff_s > 0, (xb + eff_m) / np.where(eff_s > 0, eff_s, 1), 0)),
                0, 15).astype(np.uint8)                          # [nb, 8, 32]
    # scales: bytes 0-3 low 6 bits sc[0..3] (top 2 bits: sc[4..7] >> 4), 4-7 likewise for mins,
    # 8-11: low nibble sc[4..7] & 15, high nibble mi[4..7] & 15 (gguf.quants.Q4_K.get_scale_min)
    s12 = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    s12[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    s12[:, 4:8] = (mi[:, 0:4] & 63) | ((mi[:, 4:8] >> 4) << 6)
    s12[:, 8:12] = (sc[:, 4:8] & 15) | ((mi[:, 4:8] & 15) << 4)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)     # pairs of sub-blocks per 32 bytes
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          s12, qs], axis=1)
    return out.reshape(n, k // 256 * 144)


# --- tokenizers ------------------------------------------------------------------------------
def add_gpt2_tokenizer(w, tok_dir: Path, pre: str = "default") -> None:
    """A tokenizer.json byte-level BPE written as tokenizer.ggml.model 'gpt2'."""
    import gguf
    doc = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    for t in doc.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {t["content"] for t in doc.get("added_tokens", []) if t.get("special")}
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[cfg["bos_token"]])
    w.add_eos_token_id(vocab[cfg["eos_token"]])
    w.add_add_bos_token(False)
    w.add_chat_template(cfg["chat_template"])


def spm_tokenizer_dir(path: Path, text: str, vocab_size: int) -> Path:
    """A SentencePiece-style BPE (Metaspace, byte fallback) tokenizer.json, trained locally."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + byte_tokens,
                                  initial_alphabet=sorted(set(text.replace(" ", "\u2581"))))
    tok.train_from_iterator([text], trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


def add_spm_tokenizer(w, tok_dir: Path, template: str) -> None:
    """tokenizer.ggml.model 'llama' (SentencePiece) as llama.cpp writes Gemma vocabularies."""
    import gguf
    doc = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {t["content"] for t in doc.get("added_tokens", []) if t.get("special")}
    types = []
    for t in tokens:
        if t == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        elif t in special:
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<bos>"])
    w.add_eos_token_id(vocab["<eos>"])
    w.add_unk_token_id(vocab["<unk>"])
    w.add_pad_token_id(vocab["<pad>"])
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.add_chat_template(template)


# --- the file --------------------------------------------------------------------------------
def write_gguf(model, family: str, path: Path, qtype: str, tokenizer) -> Path:
    """`model` (a tiny HF causal LM) as a GGUF file; `tokenizer(writer)` adds the vocabulary.
    qtype: F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_K_M (2-D weights; norms stay F32)."""
    import gguf
    from gguf.quants import quantize
    arch = ARCH[family]
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(FTYPE[qtype])
    if family == "qwen3_moe":
        w.add_expert_count(getattr(cfg, "num_experts", None) or cfg.num_local_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    rp = cfg.rope_parameters
    if family == "gemma3":
        full = rp["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_sliding_window(cfg.sliding_window)
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
    else:
        w.add_rope_freq_base(rp["rope_theta"])
    tokenizer(w)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], cfg.num_hidden_layers)
    sd = model.state_dict()
    if getattr(cfg, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)
    for hf, t in _split_experts(sd).items():
        t = t.detach().float()
        if family == "llama" and hf.endswith("q_proj.weight"):
            t = permute(t, cfg.num_attention_heads)
        elif family == "llama" and hf.endswith("k_proj.weight"):
            t = permute(t, cfg.num_key_value_heads)
        if family == "gemma3" and hf.endswith("norm.weight"):
            t = t + 1.0
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf
        a = t.numpy()
        if a.ndim == 1 or qtype == "F32" or name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(name, a.astype(np.float32))
        elif qtype == "F16":
            w.add_tensor(name, a.astype(np.float16))
        elif qtype == "Q4_K_M":
            if a.shape[1] % 256 == 0:
                w.add_tensor(name, quantize_q4_k(a), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
            else:                                   # llama.cpp falls back for such rows too
                qt = gguf.GGMLQuantizationType.Q8_0
                w.add_tensor(name, quantize(a, qt), raw_dtype=qt)
        else:
            qt = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, quantize(a, qt), raw_dtype=qt)
    if family == "llama" and rp.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", np.asarray(llama3_rope_factors(cfg), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _split_experts(sd: dict) -> dict:
    """convert_hf_to_gguf.py Qwen2MoeModel.modify_tensors: a fused experts.gate_up_proj
    [E, 2I, H] becomes experts.gate_proj.weight and experts.up_proj.weight [E, I, H] (gate
    first), experts.down_proj [E, H, I] experts.down_proj.weight."""
    out = {}
    for hf, t in sd.items():
        if hf.endswith("mlp.experts.gate_up_proj"):
            base, n = hf.removesuffix(".gate_up_proj"), t.shape[-2] // 2
            out[base + ".gate_proj.weight"] = t[..., :n, :]
            out[base + ".up_proj.weight"] = t[..., n:, :]
        elif hf.endswith("mlp.experts.down_proj"):
            out[hf + ".weight"] = t
        else:
            out[hf] = t
    return out


def random_model(cfg, seed: int = 0):
    """A random-weight HF causal LM of `cfg` in fp32, its norm weights moved off 1 (so a norm
    applied wrongly changes the tokens)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.float().eval()


def greedy(model, ids: list[int], n: int) -> list[int]:
    """`n` greedy tokens of a HF causal LM after `ids` (full recompute each step: the reference)."""
    from llm_fixtures import hf_logits
    ids, out = list(ids), []
    for _ in range(n):
        t = int(hf_logits(model, ids)[-1].argmax())
        out.append(t)
        ids.append(t)
    return out


def dequantized_like(model, qtype: str):
    """A copy of `model` whose 2-D weights hold what a `qtype` GGUF stores, dequantized
    (gguf.quants), i.e. the reference the engine must match for that file."""
    import copy
    import gguf
    from gguf.quants import dequantize, quantize
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            a = p.detach().float().numpy()
            if p.dim() not in (2, 3) or name.endswith("mlp.gate.weight"):    # router: F32
                continue
            if qtype == "F16":
                p.copy_(torch.from_numpy(a.astype(np.float16).astype(np.float32)))
            elif qtype == "BF16":
                p.copy_(p.to(torch.bfloat16).float())
            elif qtype == "Q4_K_M" and a.shape[1] % 256 == 0:
                qt = gguf.GGMLQuantizationType.Q4_K
                p.copy_(torch.from_numpy(dequantize(quantize_q4_k(a), qt).reshape(a.shape)))
            elif qtype in ("Q8_0", "Q4_0", "Q4_K_M"):
                qt = gguf.GGMLQuantizationType["Q8_0" if qtype == "Q4_K_M" else qtype]
                p.copy_(torch.from_numpy(dequantize(quantize(a, qt), qt).reshape(a.shape)))
    return ref
