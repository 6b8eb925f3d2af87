"""A Parakeet directory (transformers' `parakeet_ctc` / `parakeet_tdt` layouts: a FastConformer
encoder with a CTC head, or with a TDT transducer: LSTM prediction network + joint network with
a duration head): shapes from config.json, the front end from preprocessor_config.json, weights
from safetensors. No transformers at run time.

What is refused by name before any weight is read: RNN-T without durations (`parakeet_rnnt`:
transformers defines it, the engine decodes CTC and TDT only), a subsampling factor that is not a
power of the conv stride, an activation other than silu, a hidden size the heads do not divide.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torch_xdna.models.hf import ModelDirError, field_error, load_state_dict, read_config, read_json

HEADS = {"parakeet_ctc": "ctc", "parakeet_tdt": "tdt"}
MODEL_TYPES = tuple(HEADS) + ("parakeet_rnnt",)


@dataclass(frozen=True)
class ParakeetSpec:
    """The shapes of one Parakeet model (the encoder's, then the head's)."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    conv_kernel: int = 9
    sub_channels: int = 256
    sub_factor: int = 8
    sub_kernel: int = 3
    sub_stride: int = 2
    n_mels: int = 80
    vocab: int = 1025              # tokens incl. the blank
    blank: int = 1024
    head: str = "ctc"              # "ctc" | "tdt"
    scale_input: bool = True
    attention_bias: bool = True
    conv_bias: bool = True
    decoder_hidden: int = 640      # TDT prediction / joint network width
    decoder_layers: int = 2
    durations: tuple[int, ...] = ()
    max_symbols: int = 10
    eps: float = 1e-5
    name: str = "parakeet"

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def sub_layers(self) -> int:
        """Stride-2 conv stages of the subsampling stem (3 for 8x)."""
        return int(round(math.log(self.sub_factor, self.sub_stride)))

    @property
    def sub_mels(self) -> int:
        """Mel bins left after the stem (80 / 8 = 10): the stem's linear takes channels x this."""
        f = self.n_mels
        for _ in range(self.sub_layers):
            f = (f + 2 * ((self.sub_kernel - 1) // 2) - self.sub_kernel) // self.sub_stride + 1
        return f

    def frames_out(self, mel_frames: int) -> int:
        """Encoder frames of `mel_frames` feature frames (transformers'
        _get_subsampling_output_length)."""
        n, pad = mel_frames, (self.sub_kernel - 1) // 2 * 2
        for _ in range(self.sub_layers):
            n = (n + pad - self.sub_kernel) // self.sub_stride + 1
        return n

    @property
    def joint_out(self) -> int:
        return self.vocab + len(self.durations)

    def params(self) -> int:
        """Parameter count (encoder + head; BatchNorm statistics counted)."""
        h, f, k, c = self.hidden, self.ffn, self.conv_kernel, self.sub_channels
        layer = (2 * (2 * h * f + f + h) + 5 * h * h + 4 * h + 2 * h        # FFNs, q/k/v/o/rel
                 + 2 * h * h + 2 * h + h * k + h + 4 * h + h * h + h        # conv module
                 + 10 * h)                                                   # 5 LayerNorms
        stem = 9 * c + c + (self.sub_layers - 1) * (9 * c + c + c * c + c) + c * self.sub_mels * h + h
        if self.head == "ctc":
            return self.layers * layer + stem + h * self.vocab + self.vocab
        d = self.decoder_hidden
        dec = self.vocab * d + self.decoder_layers * (8 * d * d + 8 * d) + d * d + d
        return self.layers * layer + stem + h * d + d + dec + d * self.joint_out + self.joint_out

    @classmethod
    def from_config(cls, cfg: dict, path: Path, name: str = "parakeet") -> "ParakeetSpec":
        mt = cfg.get("model_type")
        if mt not in HEADS:
            why = ("RNN-T (no durations) is not decoded by this engine; CTC and TDT are"
                   if mt == "parakeet_rnnt" else "not a Parakeet CTC / TDT model")
            raise ModelDirError(f"{path}: model_type {mt!r}: {why}")
        enc = cfg.get("encoder_config") or {}

        def get(d: dict, key: str, default=None) -> int:
            v = d.get(key, default)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise field_error(path, key, v, "a positive integer")
            return v

        head = HEADS[mt]
        vocab = get(cfg, "vocab_size", 1025)
        blank = cfg.get("pad_token_id" if head == "ctc" else "blank_token_id")
        if not isinstance(blank, int) or not 0 <= blank < vocab:
            raise field_error(path, "pad_token_id" if head == "ctc" else "blank_token_id", blank,
                              f"the blank token id, below vocab_size {vocab}")
        spec = cls(hidden=get(enc, "hidden_size", 1024), layers=get(enc, "num_hidden_layers", 24),
                   heads=get(enc, "num_attention_heads", 8), ffn=get(enc, "intermediate_size", 4096),
                   conv_kernel=get(enc, "conv_kernel_size", 9),
                   sub_channels=get(enc, "subsampling_conv_channels", 256),
                   sub_factor=get(enc, "subsampling_factor", 8),
                   sub_kernel=get(enc, "subsampling_conv_kernel_size", 3),
                   sub_stride=get(enc, "subsampling_conv_stride", 2),
                   n_mels=get(enc, "num_mel_bins", 80), vocab=vocab, blank=blank, head=head,
                   scale_input=bool(enc.get("scale_input", True)),
                   attention_bias=bool(enc.get("attention_bias", True)),
                   conv_bias=bool(enc.get("convolution_bias", True)),
                   decoder_hidden=get(cfg, "decoder_hidden_size", 640),
                   decoder_layers=get(cfg, "num_decoder_layers", 2),
                   durations=tuple(int(d) for d in cfg.get("durations", ())) if head == "tdt" else (),
                   max_symbols=get(cfg, "max_symbols_per_step", 10), name=name)
        if spec.hidden % spec.heads:
            raise field_error(path, "num_attention_heads", spec.heads,
                              f"a divisor of hidden_size ({spec.hidden})")
        if spec.sub_stride ** spec.sub_layers != spec.sub_factor:
            raise field_error(path, "subsampling_factor", spec.sub_factor,
                              f"a power of subsampling_conv_stride ({spec.sub_stride})")
        if enc.get("hidden_act", "silu") != "silu":
            raise field_error(path, "hidden_act", enc.get("hidden_act"), "silu")
        if head == "tdt" and (not spec.durations or spec.durations[0] < 0):
            raise field_error(path, "durations", cfg.get("durations"), "non-negative frame counts")
        if head == "tdt" and cfg.get("hidden_act", "relu") != "relu":
            raise field_error(path, "hidden_act", cfg.get("hidden_act"), "relu (joint network)")
        return spec


@dataclass(frozen=True)
class FrontEnd:
    """ParakeetFeatureExtractor's parameters (preprocessor_config.json; its defaults)."""

    n_mels: int = 80
    sample_rate: int = 16000
    hop: int = 160
    n_fft: int = 512
    win_length: int = 400
    preemphasis: float = 0.97

    @classmethod
    def from_dir(cls, path: Path, n_mels: int) -> "FrontEnd":
        p = path / "preprocessor_config.json"
        cfg = read_json(p) if p.is_file() else {}
        fe = cls(n_mels=int(cfg.get("feature_size", n_mels)),
                 sample_rate=int(cfg.get("sampling_rate", 16000)),
                 hop=int(cfg.get("hop_length", 160)), n_fft=int(cfg.get("n_fft", 512)),
                 win_length=int(cfg.get("win_length", 400)),
                 preemphasis=float(cfg.get("preemphasis") or 0.0))
        if fe.n_mels != n_mels:
            raise ModelDirError(f"{p}: feature_size {fe.n_mels} does not match the encoder's "
                                f"num_mel_bins {n_mels}; the directory mixes two models")
        return fe


@dataclass
class ParakeetFiles:
    path: Path
    spec: ParakeetSpec
    front: FrontEnd = field(default_factory=FrontEnd)


def is_parakeet_dir(model_dir: str | Path) -> bool:
    """A directory whose config.json names a Parakeet model (any head: the loader says which
    it decodes)."""
    p = Path(model_dir)
    if not (p / "config.json").is_file():
        return False
    try:
        return read_config(p).get("model_type") in MODEL_TYPES
    except ModelDirError:
        return False


def read_parakeet(model_dir: str | Path) -> ParakeetFiles:
    path = Path(model_dir)
    cfg = read_config(path)
    spec = ParakeetSpec.from_config(cfg, path / "config.json", name=path.resolve().name)
    return ParakeetFiles(path, spec, FrontEnd.from_dir(path, spec.n_mels))


def load_parakeet_weights(files: ParakeetFiles) -> dict[str, torch.Tensor]:
    """The state dict (a "model." prefix removed), checked for what every layer needs."""
    sd = {(k[6:] if k.startswith("model.") else k): v for k, v in load_state_dict(files.path).items()}
    spec = files.spec
    need = ["encoder.subsampling.linear.weight", "encoder.subsampling.layers.0.weight"]
    for i in range(spec.layers):
        p = f"encoder.layers.{i}."
        need += [p + "self_attn.relative_k_proj.weight", p + "conv.depthwise_conv.weight",
                 p + "conv.norm.running_var", p + "feed_forward2.linear2.weight",
                 p + "norm_out.weight"]
    need += (["ctc_head.weight"] if spec.head == "ctc" else
             ["encoder_projector.weight", "decoder.embedding.weight", "joint.head.weight"]
             + [f"decoder.lstm.weight_ih_l{i}" for i in range(spec.decoder_layers)])
    missing = [k for k in need if k not in sd]
    if missing:
        raise ModelDirError(f"{files.path}: the safetensors lack {missing[0]} (and "
                            f"{len(missing) - 1} more); is this a complete Parakeet checkpoint?")
    return sd
