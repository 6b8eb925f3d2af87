"""GGUF files (llama.cpp's format) as a model source: config, tokenizer, chat template, weights.

Read with the `gguf` package (PyPI gguf, ggml-org/llama.cpp gguf-py). What a file says is turned
into the same things a HF directory gives the engine:
  - a HF-style config dict from the `{arch}.*` keys (qwen3, llama, gemma3, qwen3moe), so
    models/families.py builds the DecoderSpec and refuses unsupported features by name, as for
    config.json;
  - a `tokenizers` tokenizer from `tokenizer.ggml.*`: "gpt2" byte-level BPE with every
    pre-tokenizer split llama.cpp names (models/formats/gguf_pre.py) and "llama" SentencePiece BPE
    (Gemma, Llama 2), special tokens, BOS rule, chat template; any other tokenizer model is
    refused with the fix (--tokenizer DIR);
  - HF-named fp32 tensors, undoing what llama.cpp's convert_hf_to_gguf.py did on the way in:
    llama-arch Q/K rows permuted for its interleaved RoPE (LlamaModel.permute), Gemma norm weights
    stored as 1 + w (Gemma3Model.norm_shift), Llama 3 RoPE scaling as a `rope_freqs` tensor;
  - and, where the bits map exactly, the quantized blocks themselves (`native_blocks`): Q8_0 is
    int8 with one fp16 scale per 32 weights (ggml-common.h block_q8_0), Q4_0 is 4-bit q with
    value (q - 8) * d per 32 (block_q4_0: low nibbles hold elements 0..15, high nibbles 16..31).
    Every other type (Q4_K, Q6_K, ...) is dequantized with gguf.quants and said so in `notes`.

Mixture of experts (qwen3moe), as ggml-org/llama.cpp convert_hf_to_gguf.py (commit 0024aa74,
Qwen2MoeModel / Qwen3MoeModel, TextModel.set_gguf_parameters) writes it and src/models/qwen3moe.cpp
reads it: keys {arch}.expert_count, expert_used_count, expert_feed_forward_length; per layer the
router blk.N.ffn_gate_inp [E, H] (always F32) and each projection of all experts stacked into one
3-D tensor, blk.N.ffn_gate_exps / ffn_up_exps [E, I, H] and ffn_down_exps [E, H, I] (torch
order; GGUF lists ne reversed), quantized along the last axis so one expert's rows are one slice.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_xdna.models.formats import gguf_pre
from torch_xdna.models.hf import ModelDirError

log = logging.getLogger("torch_xdna.gguf")
GGUF_MAGIC = b"GGUF"
ARCH_MODEL_TYPE = {"qwen3": "qwen3", "llama": "llama", "gemma3": "gemma3_text", "qwen3moe": "qwen3_moe"}
MOE_ARCHS = ("qwen3moe",)
# stacked expert tensor -> the per-expert HF projection it holds (convert_hf_to_gguf.py
# Qwen2MoeModel.modify_tensors stacks model.layers.N.mlp.experts.E.{w}.weight along dim 0)
EXPERT_TENSORS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
GATING_SOFTMAX = 1                        # gguf ExpertGatingFuncType.SOFTMAX (llama-hparams.h)
QK = 32                                   # block size of Q8_0 / Q4_0 (ggml-common.h QK8_0, QK4_0)
# tokenizer.ggml.token_type values (llama.cpp llama-vocab.h / gguf TokenType)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6



def is_gguf(path: str | Path) -> bool:
    """A regular file starting with the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as fh:
        return fh.read(4) == GGUF_MAGIC


def _err(path: Path, what: str) -> ModelDirError:
    return ModelDirError(f"{path}: {what}", public=f"{path.name}: {what}")


@dataclass
class GGUFModel:
    """An opened GGUF file: metadata, tensor index and what loading it did (`notes`)."""

    path: Path
    arch: str
    meta: dict[str, Any]
    tensors: dict[str, Any]                    # name -> gguf ReaderTensor
    notes: list[str] = field(default_factory=list)

    def key(self, name: str, default: Any = None) -> Any:
        return self.meta.get(f"{self.arch}.{name}", default)

    # --- config ---------------------------------------------------------------------------
    def config(self) -> dict:
        """A HF-style config dict for models/families.py (transformers' key names)."""
        a, p = self.arch, self.path
        moe = a in MOE_ARCHS
        need = ("embedding_length", "block_count", "attention.head_count") + (
            () if moe else ("feed_forward_length",))
        missing = [f"{a}.{k}" for k in need if self.key(k) is None]
        if missing:
            raise _err(p, f"metadata key(s) {', '.join(missing)} missing; not a complete {a} GGUF")
        for k in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
            if isinstance(self.key(k), list):
                raise _err(p, f"{a}.{k} varies per layer; per-layer shapes are not supported")
        if self.key("expert_count") and not moe:       # e.g. Mixtral, written as arch llama
            raise _err(p, f"{a}.expert_count={self.key('expert_count')}: mixture-of-experts "
                          f"models are not supported by the xdna decode engine for arch {a} "
                          f"(supported: {', '.join(MOE_ARCHS)})")
        hidden, heads = int(self.key("embedding_length")), int(self.key("attention.head_count"))
        head_dim = int(self.key("attention.key_length") or hidden // heads)
        if int(self.key("attention.value_length") or head_dim) != head_dim:
            raise _err(p, f"{a}.attention.value_length differs from key_length; not supported")
        if "token_embd.weight" not in self.tensors:
            raise _err(p, "tensor token_embd.weight missing")
        vocab = int(self.tensors["token_embd.weight"].shape[1])
        cfg: dict[str, Any] = {
            "model_type": ARCH_MODEL_TYPE[a], "hidden_size": hidden,
            "num_hidden_layers": int(self.key("block_count")), "num_attention_heads": heads,
            "num_key_value_heads": int(self.key("attention.head_count_kv") or heads),
            "head_dim": head_dim, "intermediate_size": int(self.key("feed_forward_length") or 0),
            "vocab_size": vocab, "max_position_embeddings": int(self.key("context_length") or 4096),
            "rms_norm_eps": float(self.key("attention.layer_norm_rms_epsilon") or 1e-6),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "bos_token_id": self.meta.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self._eos_ids() or None,
        }
        theta = float(self.key("rope.freq_base") or (1e6 if a == "gemma3" else 10000.0))
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
        stype = self.key("rope.scaling.type")
        if stype == "linear" and float(self.key("rope.scaling.factor") or 1.0) != 1.0:
            rope = {"rope_type": "linear", "factor": float(self.key("rope.scaling.factor")),
                    "rope_theta": theta}
        elif stype not in (None, "none", "linear"):
            raise _err(p, f"{a}.rope.scaling.type {stype!r} is not supported (none, linear, and "
                          "Llama 3 rope_freqs)")
        if "rope_freqs.weight" in self.tensors:
            rope = {"rope_type": "freq_factors", "rope_theta": theta,
                    "freq_factors": self.tensor("rope_freqs.weight").tolist()}
        if a == "gemma3":
            cfg.update(self._gemma3(cfg, rope))
        else:
            cfg["hidden_act"] = "silu"
            cfg["rope_parameters"] = rope
        if moe:
            cfg.update(self._moe(cfg))
        return cfg

    def _moe(self, cfg: dict) -> dict:
        """The Qwen3-MoE config keys. llama.cpp src/models/qwen3moe.cpp: every layer routes (its
        ffn_gate_inp is required), softmax gating, the top-k weights always renormalized
        (build_moe_ffn(..., LLM_FFN_SILU, norm_w=true, ...); the converter writes no
        expert_weights_norm key for it), expert width expert_feed_forward_length, else
        feed_forward_length / expert_used_count."""
        a, p = self.arch, self.path
        experts, used = int(self.key("expert_count") or 0), int(self.key("expert_used_count") or 0)
        if experts < 1 or used < 1:
            raise _err(p, f"{a}.expert_count and {a}.expert_used_count must be > 0 (got "
                          f"{experts}, {used})")
        if int(self.key("expert_shared_count") or 0):
            raise _err(p, f"{a}.expert_shared_count={self.key('expert_shared_count')}: shared "
                          "experts are not implemented")
        gating = self.key("expert_gating_func")
        if gating is not None and int(gating) != GATING_SOFTMAX:
            raise _err(p, f"{a}.expert_gating_func={gating}: only softmax gating ({GATING_SOFTMAX}) "
                          "is implemented")
        width = int(self.key("expert_feed_forward_length") or 0) or (
            int(self.key("feed_forward_length") or 0) // used)
        want = (experts, width, cfg["hidden_size"])
        for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            t = self.tensors.get(f"blk.0.{n}.weight")
            if t is None:
                raise _err(p, f"tensor blk.0.{n}.weight missing (llama.cpp's {a} routes every "
                              "layer through stacked experts)")
            got = tuple(int(x) for x in reversed(t.shape.tolist()))
            exp = (want[0], want[2], want[1]) if n == "ffn_down_exps" else want
            if got != exp:
                raise _err(p, f"tensor blk.0.{n}.weight has shape {got}, the metadata implies "
                              f"{exp} (expert_count, rows, cols)")
        return {"num_experts": experts, "num_experts_per_tok": used,
                "moe_intermediate_size": width, "norm_topk_prob": True,
                "decoder_sparse_step": 1, "mlp_only_layers": [],
                "intermediate_size": cfg["intermediate_size"] or width}

    def _gemma3(self, cfg: dict, rope: dict) -> dict:
        # llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA3): every 6th layer global unless the
        # file states a pattern, local layers use base 10000, and the query scale is
        # 1/sqrt(head_dim) except for the 27B (62 layers): 1/sqrt(hidden/heads)
        layers = cfg["num_hidden_layers"]
        pattern = self.key("attention.sliding_window_pattern")
        if isinstance(pattern, list):
            types = ["sliding_attention" if s else "full_attention" for s in pattern]
        else:
            n = int(pattern or 6)
            types = ["full_attention" if (i + 1) % n == 0 else "sliding_attention"
                     for i in range(layers)]
        qpa = (cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 62
               else cfg["head_dim"])
        local = {"rope_type": "default",
                 "rope_theta": float(self.key("rope.freq_base_swa") or 10000.0)}
        out = {"hidden_activation": "gelu_pytorch_tanh", "layer_types": types,
               "sliding_window": int(self.key("attention.sliding_window") or 4096),
               "query_pre_attn_scalar": qpa,
               "rope_parameters": {"full_attention": rope, "sliding_attention": local}}
        for k, hf in (("final_logit_softcapping", "final_logit_softcapping"),
                      ("attn_logit_softcapping", "attn_logit_softcapping")):
            if self.key(k) is not None:
                out[hf] = float(self.key(k))
        return out

    def _eos_ids(self) -> list[int]:
        ids = []
        for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
            v = self.meta.get(k)
            if v is not None and int(v) not in ids:
                ids.append(int(v))
        return ids

    # --- tensors --------------------------------------------------------------------------
    def tensor(self, name: str, expert: int | None = None) -> torch.Tensor:
        """A tensor dequantized to fp32, in torch's [rows, cols] order (GGUF lists ne reversed);
        `expert`: only that slice of a stacked 3-D expert tensor (its blocks never span two)."""
        from gguf import GGMLQuantizationType as T
        from gguf.quants import dequantize
        t = self.tensors[name]
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))
        data = t.data if expert is None else t.data[expert]
        shape = shape if expert is None else shape[1:]
        try:
            if t.tensor_type == T.F32:
                arr = np.asarray(data, dtype=np.float32)
            else:
                arr = dequantize(np.asarray(data), t.tensor_type)
        except NotImplementedError:
            raise _err(self.path, f"tensor {name}: type {t.tensor_type.name} cannot be "
                                  "dequantized by the gguf package") from None
        return torch.from_numpy(np.array(arr, dtype=np.float32).reshape(shape))

    def tensor_type(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def file_type_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts


# --- opening ------------------------------------------------------------------------------
def open_gguf(path: str | Path) -> GGUFModel:
    """Parse a GGUF file's header; a corrupt or truncated file is a ModelDirError naming it."""
    p = Path(path)
    if not p.is_file():
        raise ModelDirError(f"{path}: no such file; pass a .gguf file or a HF model directory",
                            public="the model file does not exist")
    with open(p, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise _err(p, "not a GGUF file (no 'GGUF' magic at the start); pass a llama.cpp "
                          ".gguf file or a HF model directory")
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ModuleNotFoundError("loading GGUF files needs the gguf package: pip install "
                                  "'torch-xdna[serve]' (or pip install gguf)") from None
    try:
        reader = GGUFReader(str(p))
    except Exception as e:                    # the reader raises ValueError/IndexError/struct...
        log.debug("GGUFReader(%s) failed: %r", p, e)    # its words stay in the debug log
        raise _err(p, "corrupt or truncated GGUF file: its header or tensor table points past "
                      "the data or holds an impossible count or type; re-download or "
                      "re-convert it") from None
    meta: dict[str, Any] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            meta[name] = f.contents()
        except Exception as e:
            log.debug("GGUF metadata field %r of %s: %r", name, p, e)
            raise _err(p, f"metadata field {name!r} cannot be read (its type or length does "
                          f"not match its bytes); re-download or re-convert the file") from None
    size = p.stat().st_size
    tensors = {}
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise _err(p, f"truncated GGUF file: tensor {t.name} needs bytes up to "
                          f"{t.data_offset + t.n_bytes}, the file has {size}; re-download it")
        tensors[t.name] = t
    arch = meta.get("general.architecture")
    if arch not in ARCH_MODEL_TYPE:
        raise _err(p, f"general.architecture {arch!r} is not supported by the xdna decode engine "
                      f"(supported: {', '.join(ARCH_MODEL_TYPE)})")
    return GGUFModel(p, arch, meta, tensors)


# --- weights ------------------------------------------------------------------------------
def tensor_names(arch: str) -> dict[str, str]:
    """GGUF tensor name -> HF name ('{i}' = layer), per llama.cpp's gguf TensorNameMap."""
    L, B = "model.layers.{i}.", "blk.{i}."
    m = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
         "output.weight": "lm_head.weight",
         B + "attn_norm.weight": L + "input_layernorm.weight",
         B + "attn_q.weight": L + "self_attn.q_proj.weight",
         B + "attn_k.weight": L + "self_attn.k_proj.weight",
         B + "attn_v.weight": L + "self_attn.v_proj.weight",
         B + "attn_output.weight": L + "self_attn.o_proj.weight",
         B + "ffn_gate.weight": L + "mlp.gate_proj.weight",
         B + "ffn_up.weight": L + "mlp.up_proj.weight",
         B + "ffn_down.weight": L + "mlp.down_proj.weight"}
    if arch in ("qwen3", "gemma3", "qwen3moe"):
        m[B + "attn_q_norm.weight"] = L + "self_attn.q_norm.weight"
        m[B + "attn_k_norm.weight"] = L + "self_attn.k_norm.weight"
    if arch == "gemma3":
        m[B + "ffn_norm.weight"] = L + "pre_feedforward_layernorm.weight"
        m[B + "post_attention_norm.weight"] = L + "post_attention_layernorm.weight"
        m[B + "post_ffw_norm.weight"] = L + "post_feedforward_layernorm.weight"
    else:
        m[B + "ffn_norm.weight"] = L + "post_attention_layernorm.weight"
    if arch in MOE_ARCHS:                  # the experts: EXPERT_TENSORS, split per expert
        m[B + "ffn_gate_inp.weight"] = L + "mlp.gate.weight"
    return m


def expert_tensor(arch: str, name: str) -> tuple[int, str] | None:
    """(layer, HF projection) of a stacked expert tensor blk.N.ffn_{gate,up,down}_exps.weight."""
    parts = name.split(".")
    if (arch in MOE_ARCHS and len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
            and parts[2] in EXPERT_TENSORS and parts[3] == "weight"):
        return int(parts[1]), EXPERT_TENSORS[parts[2]]
    return None


def _hf_name(arch: str, name: str) -> str | None:
    table = tensor_names(arch)
    if name in table:
        return table[name]
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit():
        tmpl = "blk.{i}." + ".".join(parts[2:])
        if tmpl in table:
            return table[tmpl].format(i=int(parts[1]))
    return None


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf.py LlamaModel.permute: rows grouped (head, pair, half) back to HF's
    rotate-half order (head, half, pair). Works on any row-indexed array (weights, block scales)."""
    n = w.shape[0]
    return w.reshape(heads, n // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _permute_heads(g: GGUFModel, cfg: dict, hf: str) -> int | None:
    """Heads to un-permute for this HF tensor (llama arch q/k), else None."""
    if g.arch != "llama":
        return None
    if hf.endswith("q_proj.weight"):
        return cfg["num_attention_heads"]
    if hf.endswith("k_proj.weight"):
        return cfg["num_key_value_heads"]
    return None


class LazyTensors(dict):
    """name -> tensor, each dequantized only when taken (get/pop), so loading holds one fp32
    weight at a time rather than the whole model (a 4-bit file would grow 8x in fp32)."""

    def __getitem__(self, key: str) -> torch.Tensor:
        return super().__getitem__(key)()

    def get(self, key, default=None):
        return self[key] if key in self else default

    def pop(self, key, *default):
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        return super().pop(key)()

    def values(self):
        return [self[k] for k in self]

    def items(self):
        return [(k, self[k]) for k in self]


def hf_state_dict(g: GGUFModel, cfg: dict) -> LazyTensors:
    """Every weight as fp32 under its HF name, with llama.cpp's conversion transforms undone
    (dequantized lazily, on first access)."""
    out = LazyTensors()
    for name in g.tensors:
        if name == "rope_freqs.weight":
            continue                               # folded into the rope config
        stacked = expert_tensor(g.arch, name)
        if stacked is not None:                    # one HF tensor per expert, a slice each
            layer, proj = stacked
            for e in range(int(g.tensors[name].shape[-1])):
                dict.__setitem__(out, f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight",
                                 lambda name=name, e=e: g.tensor(name, e))
            continue
        hf = _hf_name(g.arch, name)
        if hf is None:
            raise _err(g.path, f"tensor {name} has no place in the {g.arch} spec; this file has "
                               "features the engine does not implement")

        def load(name: str = name, hf: str = hf) -> torch.Tensor:
            w = g.tensor(name)
            heads = _permute_heads(g, cfg, hf)
            if heads:
                w = unpermute_rows(w, heads)
            if g.arch == "gemma3" and name.endswith("norm.weight"):
                w = w - 1.0                        # stored as 1 + w (Gemma3RMSNorm)
            return w
        dict.__setitem__(out, hf, load)
    return out


NATIVE = {"Q8_0": "int8", "Q4_0": "int4"}


def native_blocks(g: GGUFModel, cfg: dict, name: str) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """(precision, q int8 [N, K] in [-128, 127] / [-8, 7], d fp16 [N, K/32]) of a Q8_0/Q4_0
    tensor (un-permuted like its weight; a 3-D expert tensor [E, I, K] gives N = E * I rows,
    expert-major), or None for any other type."""
    t = g.tensors[name]
    prec = NATIVE.get(t.tensor_type.name)
    if prec is None:
        return None
    dims = [int(x) for x in t.shape.tolist()]
    k, n = dims[0], int(np.prod(dims[1:]))      # a stacked expert tensor: all experts' rows
    raw = np.asarray(t.data, dtype=np.uint8).reshape(n, k // QK, -1)
    d = torch.from_numpy(np.ascontiguousarray(raw[..., :2]).view(np.float16)[..., 0].copy())
    if prec == "int8":                              # block_q8_0: fp16 d, int8 qs[32]
        q = np.ascontiguousarray(raw[..., 2:]).view(np.int8).reshape(n, k)
    else:                                           # block_q4_0: fp16 d, qs[16] two nibbles
        qs = raw[..., 2:]
        q = (np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - 8).reshape(n, k)
    q_t = torch.from_numpy(q.copy())
    heads = _permute_heads(g, cfg, _hf_name(g.arch, name) or "")
    if heads:
        q_t, d = unpermute_rows(q_t, heads), unpermute_rows(d, heads)
    return prec, q_t, d


# --- tokenizer ----------------------------------------------------------------------------
def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges a SentencePiece vocabulary implies: every split of a token into two vocabulary
    pieces, best (highest-scoring) merged token first, as sentencepiece's BPE applies them."""
    merges = []
    for tok, score in scores.items():
        local = [(tok[:i], tok[i:], score) for i in range(1, len(tok))
                 if tok[:i] in vocab and tok[i:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: (x[2], len(x[0]), len(x[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def build_tokenizer(g: GGUFModel):
    """(tokenizers.Tokenizer, {bos_token, eos_token, chat_template}) from tokenizer.ggml.*."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    m = g.meta
    kind = m.get("tokenizer.ggml.model")
    tokens = m.get("tokenizer.ggml.tokens")
    if kind not in ("gpt2", "llama") or not tokens:
        raise _err(g.path, f"tokenizer.ggml.model {kind!r} cannot be rebuilt here (supported: "
                           "gpt2 byte-level BPE, llama SentencePiece); pass --tokenizer DIR with "
                           "the original model's tokenizer.json")
    types = list(m.get("tokenizer.ggml.token_type") or [TT_NORMAL] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    if kind == "gpt2":
        merges = [tuple(x.split(" ", 1)) for x in (m.get("tokenizer.ggml.merges") or [])]
        if not merges:
            raise _err(g.path, "gpt2 tokenizer without tokenizer.ggml.merges; pass --tokenizer DIR")
        rule = gguf_pre.lookup(m.get("tokenizer.ggml.pre"))
        if isinstance(rule, str):
            raise _err(g.path, rule)
        regexes, ignore_merges, add_bos_default = rule
        tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
        tok.pre_tokenizer = gguf_pre.pre_tokenizer(regexes)
        tok.decoder = decoders.ByteLevel()
    else:
        scores = list(m.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
        if g.arch == "gemma3":
            # Gemma stores runs of spaces as real spaces and its merge order is the file order
            tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in tokens]
            vocab = {t: i for i, t in enumerate(tokens)}
            rank = {t: -float(i) for i, t in enumerate(tokens)}
        else:
            rank = dict(zip(tokens, (float(s) for s in scores)))
        normal = {t: s for t, s in rank.items() if types[vocab[t]] in (TT_NORMAL, TT_USER_DEFINED)}
        unk_id = m.get("tokenizer.ggml.unknown_token_id")
        tok = Tokenizer(models.BPE(vocab, _merges_from_scores(vocab, normal), byte_fallback=True,
                                   fuse_unk=True,
                                   unk_token=tokens[unk_id] if unk_id is not None else None))
        prefix = bool(m.get("tokenizer.ggml.add_space_prefix", g.arch != "gemma3"))
        norm = [normalizers.Replace(" ", "\u2581")]
        if prefix:
            norm.insert(0, normalizers.Prepend("\u2581"))
        tok.normalizer = normalizers.Sequence(norm)
        dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if prefix:
            dec.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(dec)
        add_bos_default = True
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == TT_CONTROL])
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == TT_USER_DEFINED]
    if user:
        tok.add_tokens(user)

    def name(key: str) -> str | None:
        i = m.get(key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    bos, eos = name("tokenizer.ggml.bos_token_id"), name("tokenizer.ggml.eos_token_id")
    if bool(m.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, vocab.get(bos, int(m["tokenizer.ggml.bos_token_id"])))])
    return tok, {"bos_token": bos, "eos_token": eos,
                 "chat_template": m.get("tokenizer.chat_template")}


def gguf_tokenizer(g: GGUFModel):
    """The models/tokenizer.Tokenizer interface over build_tokenizer's result."""
    from torch_xdna.models.tokenizer import Tokenizer

    class GGUFTokenizer(Tokenizer):
        def __init__(self):                       # no directory: everything from the metadata
            self.tok, cfg = build_tokenizer(g)
            self.config = cfg
            self.chat_template = cfg["chat_template"]
            self.bos_token, self.eos_token = cfg["bos_token"], cfg["eos_token"]
            self._compiled = None

    return GGUFTokenizer()
