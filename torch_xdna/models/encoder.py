"""BERT-family encoders (MiniLM, BGE, E5) as data: spec, weights and tokenizer from a HF directory.

A sentence-transformers folder adds three facts the plain HF config lacks: the max sequence length
and lowercasing (sentence_bert_config.json), the pooling (1_Pooling/config.json) and whether the
output is L2-normalized (modules.json). We honor them so results match sentence-transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from torch_xdna.models.hf import ModelDirError, iter_tensors, read_config, read_json

ENCODER_TYPES = ("bert",)
# HF hidden_act -> the epilogue name the GEMM designs know
ACTIVATION_NAMES = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu_fast": "gelu_tanh", "relu": "relu"}
POOLING_MODES = ("mean", "cls")


@dataclass(frozen=True)
class EncoderSpec:
    """Everything the embedder needs to know about one encoder, as plain data."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    max_position: int
    type_vocab: int
    eps: float
    act: str                 # epilogue name (kernels/activations.py)
    pad_token_id: int
    max_seq_length: int      # tokens per input incl. special tokens (longer inputs are truncated)
    do_lower_case: bool      # lowercase text before tokenizing (sentence-transformers option)
    pooling: str             # "mean" | "cls"
    normalize: bool          # L2-normalize the pooled vector

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def dim(self) -> int:
        return self.hidden


def _read_json(path: Path) -> dict | list | None:
    if not path.is_file():
        return None
    return read_json(path)


def transformer_dir(model_dir: str | Path) -> Path:
    """The folder holding config.json: the root, or the Transformer module's path in modules.json."""
    root = Path(model_dir)
    modules = _read_json(root / "modules.json") or []
    for m in modules if isinstance(modules, list) else []:
        if str(m.get("type", "")).endswith("models.Transformer") and m.get("path"):
            sub = root / m["path"]
            if (sub / "config.json").is_file():
                return sub
    return root


def _pooling_and_normalize(root: Path) -> tuple[str, bool]:
    modules = _read_json(root / "modules.json")
    pooling, normalize = "mean", True          # plain HF dir: the common sentence-embedding recipe
    if isinstance(modules, list):
        types = [str(m.get("type", "")) for m in modules]
        normalize = any(t.endswith("models.Normalize") for t in types)
        for m in modules:
            if str(m.get("type", "")).endswith("models.Pooling"):
                cfg = _read_json(root / m.get("path", "") / "config.json") or {}
                pooling = _pooling_mode(cfg, root / m.get("path", "") / "config.json")
    elif (root / "1_Pooling" / "config.json").is_file():
        pooling = _pooling_mode(_read_json(root / "1_Pooling" / "config.json") or {},
                                root / "1_Pooling" / "config.json")
    return pooling, normalize


def _pooling_mode(cfg: dict, path: Path) -> str:
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_mean_tokens", True) and not any(
            cfg.get(k) for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                 "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")):
        return "mean"
    raise ModelDirError(f"{path}: pooling mode not supported (supported: mean, cls tokens)")


def load_spec(model_dir: str | Path, name: str | None = None) -> EncoderSpec:
    """Read an encoder spec from a HF (optionally sentence-transformers) model directory."""
    root = Path(model_dir)
    tdir = transformer_dir(root)
    cfg = read_config(tdir)
    mtype = cfg.get("model_type", "")
    if mtype not in ENCODER_TYPES:
        raise ModelDirError(f"{tdir}/config.json: model_type {mtype!r} is not a supported encoder "
                            f"(supported: {', '.join(ENCODER_TYPES)}: BERT, MiniLM, BGE, E5)")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ModelDirError(f"{tdir}/config.json: position_embedding_type "
                            f"{cfg['position_embedding_type']!r} not supported (only 'absolute')")
    act = ACTIVATION_NAMES.get(cfg.get("hidden_act", "gelu"))
    if act is None:
        raise ModelDirError(f"{tdir}/config.json: hidden_act {cfg.get('hidden_act')!r} not supported "
                            f"(supported: {', '.join(ACTIVATION_NAMES)})")
    from torch_xdna.models.validate import check_encoder_config
    check_encoder_config(tdir / "config.json", cfg)
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        layers, inter = int(cfg["num_hidden_layers"]), int(cfg["intermediate_size"])
        vocab, max_pos = int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings", 512))
    except KeyError as e:
        raise ModelDirError(f"{tdir}/config.json: missing {e.args[0]!r}") from None
    if hidden % heads:
        raise ModelDirError(f"{tdir}/config.json: hidden_size {hidden} is not a multiple of "
                            f"num_attention_heads {heads}")
    st_cfg = _read_json(root / "sentence_bert_config.json") or {}
    tok_cfg = _read_json(tdir / "tokenizer_config.json") or {}
    max_len = st_cfg.get("max_seq_length") or tok_cfg.get("model_max_length") or max_pos
    max_len = min(int(max_len) if int(max_len) < 10**9 else max_pos, max_pos)
    pooling, normalize = _pooling_and_normalize(root)
    return EncoderSpec(
        name=name or root.resolve().name, hidden=hidden, layers=layers, heads=heads,
        intermediate=inter, vocab=vocab, max_position=max_pos,
        type_vocab=int(cfg.get("type_vocab_size", 2)), eps=float(cfg.get("layer_norm_eps", 1e-12)),
        act=act, pad_token_id=int(cfg.get("pad_token_id") or 0), max_seq_length=max_len,
        do_lower_case=bool(st_cfg.get("do_lower_case", False)), pooling=pooling,
        normalize=normalize)


# --- weights -----------------------------------------------------------------------------------
def _hf_names(spec: EncoderSpec) -> dict[str, str]:
    """canonical name -> HF tensor name (without the optional 'bert.' prefix)."""
    names = {
        "word_emb": "embeddings.word_embeddings.weight",
        "pos_emb": "embeddings.position_embeddings.weight",
        "type_emb": "embeddings.token_type_embeddings.weight",
        "emb_ln_w": "embeddings.LayerNorm.weight",
        "emb_ln_b": "embeddings.LayerNorm.bias",
    }
    for i in range(spec.layers):
        p = f"encoder.layer.{i}."
        for short, hf in (("q", "attention.self.query"), ("k", "attention.self.key"),
                          ("v", "attention.self.value"), ("o", "attention.output.dense"),
                          ("up", "intermediate.dense"), ("down", "output.dense")):
            names[f"{i}.{short}.w"] = p + hf + ".weight"
            names[f"{i}.{short}.b"] = p + hf + ".bias"
        for short, hf in (("attn_ln", "attention.output.LayerNorm"), ("ffn_ln", "output.LayerNorm")):
            names[f"{i}.{short}.w"] = p + hf + ".weight"
            names[f"{i}.{short}.b"] = p + hf + ".bias"
    return names


def _expected_shape(spec: EncoderSpec, key: str) -> tuple[int, ...]:
    h, i = spec.hidden, spec.intermediate
    fixed = {"word_emb": (spec.vocab, h), "pos_emb": (spec.max_position, h),
             "type_emb": (spec.type_vocab, h), "emb_ln_w": (h,), "emb_ln_b": (h,)}
    if key in fixed:
        return fixed[key]
    _, site, part = key.split(".")
    out_dim, in_dim = {"up": (i, h), "down": (h, i)}.get(site, (h, h))
    return (out_dim, in_dim) if part == "w" and site not in ("attn_ln", "ffn_ln") else (out_dim,)


def load_encoder_weights(model_dir: str | Path, spec: EncoderSpec) -> dict[str, torch.Tensor]:
    """HF tensors under canonical names, shape-checked. Linear weights stay [out, in] as stored."""
    wanted = {hf: key for key, hf in _hf_names(spec).items()}
    found: dict[str, torch.Tensor] = {}
    for name, t in iter_tensors(transformer_dir(model_dir)):
        for prefix in ("", "bert.", "model.", "encoder_model."):
            if name.startswith(prefix) and name[len(prefix):] in wanted:
                found[wanted[name[len(prefix):]]] = t
                break
    missing = [hf for hf, key in wanted.items() if key not in found]
    if missing:
        raise ModelDirError(f"{model_dir}: weights missing for this BERT config: "
                            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for key, t in found.items():
        exp = _expected_shape(spec, key)
        if tuple(t.shape) != exp:
            raise ModelDirError(f"{model_dir}: tensor {_hf_names(spec)[key]} has shape "
                                f"{tuple(t.shape)}, config.json implies {exp}")
    return found


# --- tokenizer ---------------------------------------------------------------------------------
class EncoderTokenizer:
    """Text -> token ids with the model's special tokens, truncated to max_seq_length."""

    def __init__(self, model_dir: str | Path, spec: EncoderSpec):
        from tokenizers import Tokenizer
        tdir = transformer_dir(model_dir)
        path = tdir / "tokenizer.json"
        if path.is_file():
            tok = Tokenizer.from_file(str(path))
        elif (tdir / "vocab.txt").is_file():
            from tokenizers.implementations import BertWordPieceTokenizer
            tok_cfg = _read_json(tdir / "tokenizer_config.json") or {}
            tok = BertWordPieceTokenizer(str(tdir / "vocab.txt"),
                                         lowercase=bool(tok_cfg.get("do_lower_case", True)))
        else:
            raise ModelDirError(f"{model_dir}: no tokenizer.json or vocab.txt; the embedder needs one")
        tok.no_padding()
        tok.no_truncation()
        self._tok = tok
        self.spec = spec
        self.cls_id = self._special("[CLS]", "<s>")
        self.sep_id = self._special("[SEP]", "</s>")

    def _special(self, *names: str) -> int | None:
        for n in names:
            i = self._tok.token_to_id(n)
            if i is not None:
                return i
        return None

    def _prep(self, text: str) -> str:
        return text.lower() if self.spec.do_lower_case else text

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Ids with special tokens, NOT truncated (the caller decides: truncate or reject)."""
        return [e.ids for e in self._tok.encode_batch([self._prep(t) for t in texts])]

    def wrap(self, ids: list[int]) -> list[int]:
        """Raw vocabulary ids (no special tokens) -> a model input with [CLS] ... [SEP]."""
        head = [self.cls_id] if self.cls_id is not None else []
        tail = [self.sep_id] if self.sep_id is not None else []
        return head + list(ids) + tail

    def truncate(self, ids: list[int]) -> list[int]:
        """Cut to max_seq_length, keeping the final [SEP] as sentence-transformers does."""
        n = self.spec.max_seq_length
        if len(ids) <= n:
            return ids
        if self.sep_id is not None and ids[-1] == self.sep_id:
            return ids[:n - 1] + [self.sep_id]
        return ids[:n]
