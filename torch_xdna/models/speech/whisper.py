"""A Whisper directory (WhisperForConditionalGeneration layout, any size): shapes from config.json,
decoding controls from generation_config.json (and the tokenizer's special tokens when that file
lacks them), weights from safetensors. No transformers at run time."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torch_xdna.models.hf import ModelDirError, field_error, load_state_dict, read_config, read_json

TIMESTAMP_STEP_S = 0.02          # one timestamp token = 20 ms (Whisper's time precision)


@dataclass(frozen=True)
class WhisperSpec:
    """The shapes of one Whisper model."""

    d_model: int
    encoder_layers: int
    encoder_heads: int
    encoder_ffn: int
    decoder_layers: int
    decoder_heads: int
    decoder_ffn: int
    n_mels: int
    source_positions: int        # encoder frames per 30-s window (1500)
    target_positions: int        # decoder positions (448)
    vocab: int
    act: str = "gelu"
    eps: float = 1e-5
    embed_scale: float = 1.0
    name: str = "whisper"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.decoder_heads

    @property
    def mel_frames(self) -> int:
        return 2 * self.source_positions

    def params(self) -> int:
        """Parameter count (the tied output projection counted once)."""
        h = self.d_model
        enc = self.encoder_layers * (4 * h * h + 2 * h * self.encoder_ffn + 10 * h + self.encoder_ffn)
        dec = self.decoder_layers * (8 * h * h + 2 * h * self.decoder_ffn + 17 * h + self.decoder_ffn)
        stem = self.n_mels * h * 3 + h * h * 3 + 2 * h + self.source_positions * h
        return enc + dec + stem + self.vocab * h + self.target_positions * h + 4 * h

    @classmethod
    def from_config(cls, cfg: dict, path: Path, name: str = "whisper") -> "WhisperSpec":
        def get(key: str, default=None) -> int:
            v = cfg.get(key, default)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise field_error(path, key, v, "a positive integer")
            return v
        h = get("d_model")
        spec = cls(d_model=h, encoder_layers=get("encoder_layers"),
                   encoder_heads=get("encoder_attention_heads"),
                   encoder_ffn=get("encoder_ffn_dim"), decoder_layers=get("decoder_layers"),
                   decoder_heads=get("decoder_attention_heads"),
                   decoder_ffn=get("decoder_ffn_dim"), n_mels=get("num_mel_bins", 80),
                   source_positions=get("max_source_positions", 1500),
                   target_positions=get("max_target_positions", 448), vocab=get("vocab_size"),
                   act=str(cfg.get("activation_function", "gelu")),
                   embed_scale=(h ** 0.5) if cfg.get("scale_embedding") else 1.0, name=name)
        for heads_key, heads in (("encoder_attention_heads", spec.encoder_heads),
                                 ("decoder_attention_heads", spec.decoder_heads)):
            if h % heads:
                raise field_error(path, heads_key, heads, f"a divisor of d_model ({h})")
        if spec.act not in ("gelu", "gelu_new", "relu"):
            raise field_error(path, "activation_function", spec.act, "gelu, gelu_new or relu")
        return spec


@dataclass
class DecodingTokens:
    """The special tokens decoding needs (generation_config.json, else the tokenizer's)."""

    start: int                              # <|startoftranscript|>
    eos: int                                # <|endoftext|>
    no_timestamps: int | None = None        # <|notimestamps|>; timestamps follow it
    no_speech: int | None = None            # <|nospeech|> / <|nocaptions|>
    lang_to_id: dict[str, int] = field(default_factory=dict)      # "<|en|>" -> id
    task_to_id: dict[str, int] = field(default_factory=dict)      # "transcribe" -> id
    prev: int | None = None                 # <|startofprev|> (prompt text goes after it)
    suppress: tuple[int, ...] = ()
    begin_suppress: tuple[int, ...] = ()
    is_multilingual: bool = False
    max_initial_timestamp_index: int | None = None
    max_length: int = 448

    @property
    def timestamp_begin(self) -> int | None:
        return None if self.no_timestamps is None else self.no_timestamps + 1


def _specials(model_dir: Path) -> dict[str, int]:
    """content -> id of the tokenizer's added tokens (tokenizer.json), {} without one."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])
            if isinstance(t, dict) and "content" in t and "id" in t}


def read_decoding_tokens(model_dir: Path, cfg: dict, gen: dict | None = None) -> DecodingTokens:
    gpath = model_dir / "generation_config.json"
    g = read_json(gpath) if gpath.is_file() else (gen or {})
    sp = _specials(model_dir)
    start = g.get("decoder_start_token_id", cfg.get("decoder_start_token_id",
                                                    sp.get("<|startoftranscript|>")))
    eos = g.get("eos_token_id", cfg.get("eos_token_id", sp.get("<|endoftext|>")))
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if not isinstance(start, int) or not isinstance(eos, int):
        raise ModelDirError(f"{gpath}: no decoder_start_token_id / eos_token_id (and no "
                            "<|startoftranscript|> / <|endoftext|> in tokenizer.json)")
    langs = g.get("lang_to_id") or {k: v for k, v in sp.items() if _is_lang(k)}
    tasks = g.get("task_to_id") or {t: sp[f"<|{t}|>"] for t in ("transcribe", "translate")
                                    if f"<|{t}|>" in sp}
    no_ts = g.get("no_timestamps_token_id", sp.get("<|notimestamps|>"))
    no_speech = sp.get("<|nospeech|>", sp.get("<|nocaptions|>"))
    return DecodingTokens(
        start=start, eos=eos, no_timestamps=no_ts, no_speech=no_speech,
        lang_to_id={str(k): int(v) for k, v in langs.items()},
        task_to_id={str(k): int(v) for k, v in tasks.items()}, prev=sp.get("<|startofprev|>"),
        suppress=tuple(int(t) for t in (g.get("suppress_tokens") or ())),
        begin_suppress=tuple(int(t) for t in (g.get("begin_suppress_tokens") or ())),
        is_multilingual=bool(g.get("is_multilingual", len(langs) > 1)),
        max_initial_timestamp_index=g.get("max_initial_timestamp_index"),
        max_length=int(g.get("max_length") or cfg.get("max_target_positions", 448)))


def _is_lang(tok: str) -> bool:
    inner = tok[2:-2] if tok.startswith("<|") and tok.endswith("|>") else ""
    return 2 <= len(inner) <= 3 and inner.isalpha() and inner.islower() or inner == "haw"


@dataclass
class WhisperFiles:
    path: Path
    spec: WhisperSpec
    tokens: DecodingTokens
    weights: dict[str, torch.Tensor] | None = None     # a CTranslate2 directory's, already read


def read_whisper(model_dir: str | Path) -> WhisperFiles:
    """A HF Whisper directory, or a CTranslate2 one (faster-whisper's; models/formats/ct2.py)."""
    from torch_xdna.models.formats import ct2
    from torch_xdna.models.packaged import resolve
    path = resolve(model_dir)
    if path.is_dir() and ct2.is_ct2_dir(path):
        cfg, gen, sd = ct2.read_ct2_whisper(path)
        spec = WhisperSpec.from_config(cfg, path / "model.bin", name=path.resolve().name)
        return WhisperFiles(path, spec, read_decoding_tokens(path, cfg, gen), sd)
    cfg = read_config(path)
    if cfg.get("model_type") != "whisper":
        raise ModelDirError(f"{path / 'config.json'}: model_type {cfg.get('model_type')!r} is not "
                            "whisper; pass a WhisperForConditionalGeneration directory")
    spec = WhisperSpec.from_config(cfg, path / "config.json", name=path.resolve().name)
    return WhisperFiles(path, spec, read_decoding_tokens(path, cfg))


def load_whisper_weights(files: WhisperFiles) -> dict[str, torch.Tensor]:
    """The state dict with the "model." prefix removed; proj_out tied to embed_tokens if absent."""
    sd = files.weights if files.weights is not None else load_state_dict(files.path)
    out = {(k[6:] if k.startswith("model.") else k): v for k, v in sd.items()}
    out.setdefault("proj_out.weight", out.get("decoder.embed_tokens.weight"))
    spec = files.spec
    need = ["encoder.conv1.weight", "encoder.conv2.weight", "encoder.embed_positions.weight",
            "encoder.layer_norm.weight", "decoder.embed_tokens.weight",
            "decoder.embed_positions.weight", "decoder.layer_norm.weight"]
    need += [f"encoder.layers.{i}.fc1.weight" for i in range(spec.encoder_layers)]
    need += [f"decoder.layers.{i}.encoder_attn.k_proj.weight" for i in range(spec.decoder_layers)]
    missing = [k for k in need if out.get(k) is None]
    if missing:
        raise ModelDirError(f"{files.path}: the safetensors lack {missing[0]} (and "
                            f"{len(missing) - 1} more); is this a complete Whisper checkpoint?")
    return out
