"""BERT-family encoders (MiniLM, BGE; XLM-R / RoBERTa: multilingual E5) as data: spec, weights
and tokenizer from a HF directory.

A sentence-transformers folder adds what the plain HF config lacks: the max sequence length and
lowercasing, the pooling, whether the output is L2-normalized and the named prompts
(models/formats/st_config.py reads them). We honor them so results match sentence-transformers.
XLM-R / RoBERTa differ from BERT in data only: position ids start after the padding id
(`position_offset`; the table's first pad_token_id + 1 rows are never read) and one token type.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from torch_xdna.models.hf import ModelDirError, iter_tensors, read_config, read_json
from torch_xdna.models.formats.st_config import SentenceConfig, read_sentence_config, transformer_dir

ENCODER_TYPES = ("bert", "xlm-roberta", "roberta", "modernbert", "esm")
PRENORM_TYPES = ("modernbert", "esm")     # pre-norm rotary encoders (PreNormArch)
# RoBERTa-style position ids: pad_token_id + 1 + index (transformers create_position_ids_from_input_ids)
_OFFSET_POSITIONS = ("xlm-roberta", "roberta")
# HF hidden_act -> the epilogue name the GEMM designs know
ACTIVATION_NAMES = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu_fast": "gelu_tanh", "relu": "relu"}


@dataclass(frozen=True)
class PreNormArch:
    """What a pre-norm rotary encoder (ModernBERT, ESM-2) adds to the spec, per layer as data."""

    windows: tuple[int, ...]        # per layer: 0 = global attention, w = keys with |i-j| <= w
    thetas: tuple[float, ...]       # per layer RoPE base
    gated: bool                     # GeGLU FFN (ModernBERT) vs plain act FFN (ESM)
    first_attn_norm: bool           # layer 0 norms before attention (ESM yes, ModernBERT no)
    emb_norm: bool                  # LayerNorm after the embedding lookup
    token_dropout: bool = False     # ESM: embeddings scaled by 0.88 / (1 - masked share)
    mask_token_id: int | None = None


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
    pooling: str             # one of st_config.POOLING_MODES
    normalize: bool          # L2-normalize the pooled vector
    model_type: str = "bert"
    position_offset: int = 0  # position ids start here (XLM-R / RoBERTa: pad_token_id + 1)
    sentence: SentenceConfig = SentenceConfig()   # prompts, include_prompt (sentence-transformers)
    arch: PreNormArch | None = None   # None: BERT's post-norm layers

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


def _max_seq_length(st: SentenceConfig, tdir: Path, positions: int) -> int:
    """sentence-transformers' max_seq_length, else the tokenizer's model_max_length, within the
    model's positions."""
    tok_cfg = _read_json(tdir / "tokenizer_config.json") or {}
    max_len = st.max_seq_length or tok_cfg.get("model_max_length") or positions
    return min(int(max_len) if int(max_len) < 10**9 else positions, positions)


def load_spec(model_dir: str | Path, name: str | None = None) -> EncoderSpec:
    """Read an encoder spec from a HF (optionally sentence-transformers) model directory."""
    root = Path(model_dir)
    tdir = transformer_dir(root)
    cfg = read_config(tdir)
    mtype = cfg.get("model_type", "")
    if mtype in PRENORM_TYPES:
        return _prenorm_spec(cfg, tdir, root, name)
    if mtype not in ENCODER_TYPES:
        raise ModelDirError(f"{tdir}/config.json: model_type {mtype!r} is not a supported encoder "
                            f"(supported: {', '.join(ENCODER_TYPES)}: BERT, MiniLM, BGE, E5, "
                            "multilingual E5)")
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
    pad = int(cfg.get("pad_token_id") or 0)
    offset = pad + 1 if mtype in _OFFSET_POSITIONS else 0
    if offset >= max_pos:
        raise ModelDirError(f"{tdir}/config.json: pad_token_id {pad} leaves no positions in "
                            f"max_position_embeddings {max_pos} ({mtype} positions start at "
                            "pad_token_id + 1)")
    positions = max_pos - offset
    st = read_sentence_config(root)
    max_len = _max_seq_length(st, tdir, positions)
    return EncoderSpec(
        name=name or root.resolve().name, hidden=hidden, layers=layers, heads=heads,
        intermediate=inter, vocab=vocab, max_position=positions,
        type_vocab=int(cfg.get("type_vocab_size", 2)), eps=float(cfg.get("layer_norm_eps", 1e-12)),
        act=act, pad_token_id=pad, max_seq_length=max_len, do_lower_case=st.do_lower_case,
        pooling=st.pooling, normalize=st.normalize, model_type=mtype, position_offset=offset,
        sentence=st)


def _int(cfg: dict, key: str, tdir: Path, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ModelDirError(f"{tdir}/config.json: {key!r} is {v!r}; expected a non-negative integer")
    return v


def _prenorm_spec(cfg: dict, tdir: Path, root: Path, name: str | None) -> EncoderSpec:
    """ModernBERT / ESM-2 config.json (transformers' field names) -> EncoderSpec with a PreNormArch."""
    mtype = cfg["model_type"]
    hidden, heads = _int(cfg, "hidden_size", tdir), _int(cfg, "num_attention_heads", tdir)
    layers, vocab = _int(cfg, "num_hidden_layers", tdir), _int(cfg, "vocab_size", tdir)
    if not heads or hidden % heads or (hidden // heads) % 2:
        raise ModelDirError(f"{tdir}/config.json: hidden_size {hidden} / num_attention_heads "
                            f"{heads} must give an even head size (rotary)")
    if mtype == "modernbert":
        act_name = cfg.get("hidden_activation", "gelu")
        types = cfg.get("layer_types") or [
            "full_attention" if i % int(cfg.get("global_attn_every_n_layers", 3)) == 0
            else "sliding_attention" for i in range(layers)]
        rope = cfg.get("rope_parameters") or {}
        base = {"full_attention": float((rope.get("full_attention") or {}).get(
                    "rope_theta", cfg.get("global_rope_theta", 160000.0))),
                "sliding_attention": float((rope.get("sliding_attention") or {}).get(
                    "rope_theta", cfg.get("local_rope_theta", 10000.0)))}
        for t, r in rope.items():
            if isinstance(r, dict) and r.get("rope_type", "default") != "default":
                raise ModelDirError(f"{tdir}/config.json: rope_parameters[{t!r}] rope_type "
                                    f"{r['rope_type']!r} not supported (only 'default')")
        if len(types) != layers or not set(types) <= set(base):
            raise ModelDirError(f"{tdir}/config.json: layer_types must list {layers} entries of "
                                "'full_attention' / 'sliding_attention'")
        half = _int(cfg, "local_attention", tdir, 128) // 2
        arch = PreNormArch(windows=tuple(half if t == "sliding_attention" else 0 for t in types),
                           thetas=tuple(base[t] for t in types), gated=True,
                           first_attn_norm=False, emb_norm=True)
        eps, max_pos = float(cfg.get("norm_eps", 1e-5)), _int(cfg, "max_position_embeddings", tdir, 8192)
    else:
        if cfg.get("position_embedding_type", "absolute") != "rotary":
            raise ModelDirError(f"{tdir}/config.json: ESM position_embedding_type "
                                f"{cfg.get('position_embedding_type')!r} not supported (ESM-2: "
                                "'rotary')")
        act_name = cfg.get("hidden_act", "gelu")
        theta = float(cfg.get("rope_theta", 10000.0))
        mask_id = cfg.get("mask_token_id")
        arch = PreNormArch(windows=(0,) * layers, thetas=(theta,) * layers, gated=False,
                           first_attn_norm=True, emb_norm=bool(cfg.get("emb_layer_norm_before")),
                           token_dropout=bool(cfg.get("token_dropout")),
                           mask_token_id=int(mask_id) if isinstance(mask_id, int) else None)
        # fair-esm positions start after padding_idx + 1 (1026 -> 1,024 tokens: ESM-2's crops)
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        max_pos = _int(cfg, "max_position_embeddings", tdir, 1026) - (int(cfg.get("pad_token_id") or 0) + 1)
    act = ACTIVATION_NAMES.get(act_name)
    if act is None:
        raise ModelDirError(f"{tdir}/config.json: activation {act_name!r} not supported "
                            f"(supported: {', '.join(ACTIVATION_NAMES)})")
    st = read_sentence_config(root)
    max_len = _max_seq_length(st, tdir, max_pos)
    return EncoderSpec(
        name=name or root.resolve().name, hidden=hidden, layers=layers, heads=heads,
        intermediate=_int(cfg, "intermediate_size", tdir), vocab=vocab, max_position=max_pos,
        type_vocab=1, eps=eps, act=act, pad_token_id=int(cfg.get("pad_token_id") or 0),
        max_seq_length=max_len, do_lower_case=st.do_lower_case, pooling=st.pooling,
        normalize=st.normalize, model_type=mtype, sentence=st, arch=arch)


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
    fixed = {"word_emb": (spec.vocab, h), "pos_emb": (spec.max_position + spec.position_offset, h),
             "type_emb": (spec.type_vocab, h), "emb_ln_w": (h,), "emb_ln_b": (h,)}
    if key in fixed:
        return fixed[key]
    _, site, part = key.split(".")
    out_dim, in_dim = {"up": (i, h), "down": (h, i)}.get(site, (h, h))
    return (out_dim, in_dim) if part == "w" and site not in ("attn_ln", "ffn_ln") else (out_dim,)


def load_encoder_weights(model_dir: str | Path, spec: EncoderSpec) -> dict[str, torch.Tensor]:
    """HF tensors under canonical names, shape-checked. Linear weights stay [out, in] as stored;
    the position table starts at the spec's first position (RoBERTa: after pad_token_id + 1 rows)."""
    wanted = {hf: key for key, hf in _hf_names(spec).items()}
    found: dict[str, torch.Tensor] = {}
    for name, t in iter_tensors(transformer_dir(model_dir)):
        for prefix in ("", "bert.", "roberta.", "model.", "encoder_model."):
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
    found["pos_emb"] = found["pos_emb"][spec.position_offset:]
    return found


def _prenorm_sources(spec: EncoderSpec) -> dict[str, tuple[str, ...]]:
    """canonical name -> the checkpoint tensor(s) it is made of (several: concatenated)."""
    if spec.model_type == "modernbert":
        src = {"word_emb": ("embeddings.tok_embeddings.weight",), "emb_ln": "embeddings.norm",
               "final_ln": "final_norm"}
        for i in range(spec.layers):
            p = f"layers.{i}."
            src.update({f"{i}.attn_ln": p + "attn_norm", f"{i}.qkv": (p + "attn.Wqkv",),
                        f"{i}.o": (p + "attn.Wo",), f"{i}.ffn_ln": p + "mlp_norm",
                        f"{i}.up": (p + "mlp.Wi",), f"{i}.down": (p + "mlp.Wo",)})
        return src
    src = {"word_emb": ("embeddings.word_embeddings.weight",), "emb_ln": "embeddings.layer_norm",
           "final_ln": "encoder.emb_layer_norm_after"}
    for i in range(spec.layers):
        p = f"encoder.layer.{i}."
        src.update({f"{i}.attn_ln": p + "attention.LayerNorm",
                    f"{i}.qkv": tuple(p + f"attention.self.{x}" for x in ("query", "key", "value")),
                    f"{i}.o": (p + "attention.output.dense",), f"{i}.ffn_ln": p + "LayerNorm",
                    f"{i}.up": (p + "intermediate.dense",), f"{i}.down": (p + "output.dense",)})
    return src


def load_prenorm_weights(model_dir: str | Path, spec: EncoderSpec) -> dict[str, torch.Tensor]:
    """ModernBERT / ESM-2 tensors under canonical names: linear `{site}.w` [out, in] and `.b`
    (zeros where the checkpoint has no bias), norms `{ln}.w` / `.b` (ones / zeros where the model
    has none, e.g. ModernBERT's first attention norm), Q/K/V concatenated, shape-checked."""
    tensors: dict[str, torch.Tensor] = {}
    for name, t in iter_tensors(transformer_dir(model_dir)):
        for prefix in ("model.", "esm.", ""):
            if name.startswith(prefix):
                tensors.setdefault(name[len(prefix):], t)
    h, inter = spec.hidden, spec.intermediate
    up_rows = 2 * inter if spec.arch is not None and spec.arch.gated else inter
    out_in = {"qkv": (3 * h, h), "o": (h, h), "up": (up_rows, h), "down": (h, inter)}
    w: dict[str, torch.Tensor] = {}

    def pick(*names: str) -> torch.Tensor | None:
        return next((tensors[n] for n in names if n in tensors), None)

    for key, src in _prenorm_sources(spec).items():
        if key == "word_emb":
            t = pick(*src)
            if t is None:
                raise ModelDirError(f"{model_dir}: weights missing: {src[0]}")
            w[key] = t
        elif isinstance(src, str):                       # a LayerNorm (weight|gamma, bias|beta)
            g, b = pick(src + ".weight", src + ".gamma"), pick(src + ".bias", src + ".beta")
            w[key + ".w"] = g if g is not None else torch.ones(h)
            w[key + ".b"] = b if b is not None else torch.zeros(h)
        else:                                            # a linear site, maybe concatenated
            parts = [pick(n + ".weight") for n in src]
            if any(x is None for x in parts):
                raise ModelDirError(f"{model_dir}: weights missing: "
                                    f"{', '.join(n + '.weight' for n, x in zip(src, parts) if x is None)}")
            w[key + ".w"] = torch.cat(parts) if len(parts) > 1 else parts[0]
            bias = [pick(n + ".bias") for n in src]
            w[key + ".b"] = (torch.cat([x if x is not None else torch.zeros(p.shape[0])
                                        for x, p in zip(bias, parts)]))
    for key, t in w.items():
        site = key.split(".")[1] if key[0].isdigit() else key
        exp = ((spec.vocab, h) if key == "word_emb"
               else out_in[site] if key.endswith(".w") and site in out_in
               else (out_in[site][0],) if site in out_in else (h,))
        if tuple(t.shape) != exp:
            raise ModelDirError(f"{model_dir}: tensor for {key} has shape {tuple(t.shape)}, "
                                f"config.json implies {exp}")
    return w


# --- tokenizer ---------------------------------------------------------------------------------
def protein_tokenizer(vocab_file: Path):
    """ESM's tokenizer (transformers EsmTokenizer: one token per vocab.txt line, `<...>` tokens
    matched whole, whitespace dropped, other characters one token each, `<cls> ... <eos>`) as a
    `tokenizers` pipeline. One difference: a run of unknown characters is one `<unk>` there and
    one `<unk>` per character here (protein alphabets have none)."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(Path(vocab_file).read_text().splitlines()) if t}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")])
    tok.add_special_tokens([AddedToken(t, special=True) for t in vocab if t.startswith("<")])
    tok.post_processor = processors.TemplateProcessing(
        single="<cls> $A <eos>", special_tokens=[("<cls>", vocab["<cls>"]), ("<eos>", vocab["<eos>"])])
    return tok


class EncoderTokenizer:
    """Text -> token ids with the model's special tokens, truncated to max_seq_length."""

    def __init__(self, model_dir: str | Path, spec: EncoderSpec):
        from tokenizers import Tokenizer
        tdir = transformer_dir(model_dir)
        path = tdir / "tokenizer.json"
        if path.is_file():
            tok = Tokenizer.from_file(str(path))
        elif spec.model_type == "esm" and (tdir / "vocab.txt").is_file():
            tok = protein_tokenizer(tdir / "vocab.txt")
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
        self.cls_id = self._special("[CLS]", "<s>", "<cls>")
        self.sep_id = self._special("[SEP]", "</s>", "<eos>")
        self.special_ids = frozenset(
            {i for i in (self.cls_id, self.sep_id) if i is not None}
            | {i for i, t in tok.get_added_tokens_decoder().items() if t.special})

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

    def prompt_length(self, prefix: str) -> int:
        """Tokens of a prompt as sentence-transformers counts them for include_prompt=False:
        the prompt encoded alone, without a trailing special token."""
        if not prefix:
            return 0
        ids = self.encode([prefix])[0]
        return len(ids) - (1 if ids and ids[-1] in self.special_ids else 0)

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
