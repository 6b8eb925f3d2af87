"""CTranslate2 model directories (what faster-whisper users have on disk) as a Whisper source.

A CTranslate2 directory holds model.bin (the spec's variables), config.json (decoding ids, not a
HF config) and the tokenizer. model.bin is read as CTranslate2's ModelSpec._serialize writes it
(OpenNMT/CTranslate2 python/ctranslate2/specs/model_spec.py at 04ebb5bc, binary version 6):
uint32 version, the spec name, uint32 revision, uint32 count, then per variable its name, rank,
dims (uint32 each), dtype id (float32, int8, int16, int32, float16, bfloat16), uint32 byte count
and the bytes; then the aliases (name -> variable). Strings are uint16 length (with the NUL)
plus the UTF-8 bytes and a NUL.

The WhisperSpec variables are renamed to the HF Whisper names, undoing what CTranslate2's
transformers converter (WhisperLoader) fused: self-attention q/k/v as one linear_0 (k without a
bias: its zero bias slice is dropped), cross-attention k/v as linear_1. Weights stay in the
file's dtype until the engine quantizes them; int8/int16 weights (a quantized conversion) are
refused with the fix, since their scales are per-row values we do not reproduce exactly.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from torch_xdna.models.hf import ModelDirError, read_json

DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, "bfloat16")
MAX_VERSION = 6


def is_ct2_dir(path: Path) -> bool:
    """A directory with model.bin and a config.json without a HF model_type."""
    if not (path / "model.bin").is_file():
        return False
    cfg = path / "config.json"
    if not cfg.is_file():
        return True
    try:
        data = read_json(cfg)
    except ModelDirError:
        return False
    return isinstance(data, dict) and "model_type" not in data


def _err(path: Path, what: str) -> ModelDirError:
    return ModelDirError(f"{path}: {what}", public=f"{path.name}: {what}")


def _read(fh: BinaryIO, fmt: str, path: Path) -> Any:
    size = struct.calcsize(fmt)
    raw = fh.read(size)
    if len(raw) != size:
        raise _err(path, "truncated CTranslate2 model.bin; re-download or re-convert it")
    return struct.unpack("<" + fmt, raw)[0]


def _string(fh: BinaryIO, path: Path) -> str:
    n = _read(fh, "H", path)
    raw = fh.read(n)
    if len(raw) != n:
        raise _err(path, "truncated CTranslate2 model.bin; re-download or re-convert it")
    return raw[:-1].decode("utf-8", errors="replace")


def read_model_bin(path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """(spec name, variable -> tensor) of a model.bin, aliases resolved; scalars as 0-d tensors."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        version = _read(fh, "I", path)
        if not 1 <= version <= MAX_VERSION:
            raise _err(path, f"not a CTranslate2 model.bin (binary version {version}; this "
                             f"reader knows 1..{MAX_VERSION})")
        name = _string(fh, path) if version >= 2 else ""
        if version >= 2:
            _read(fh, "I", path)                        # spec revision
        out: dict[str, torch.Tensor] = {}
        for _ in range(_read(fh, "I", path)):
            var = _string(fh, path)
            dims = [_read(fh, "I", path) for _ in range(_read(fh, "B", path))]
            dtype_id = _read(fh, "B", path) if version >= 4 else 0
            nbytes = _read(fh, "I", path)
            if dtype_id >= len(DTYPES) or fh.tell() + nbytes > size:
                raise _err(path, f"variable {var}: bad dtype {dtype_id} or truncated data")
            raw = fh.read(nbytes)
            dt = DTYPES[dtype_id]
            if dt == "bfloat16":
                t = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16)
            else:
                t = torch.from_numpy(np.frombuffer(raw, dtype=dt).copy())
            out[var] = t.reshape(dims)
        if version >= 3:
            for _ in range(_read(fh, "I", path)):
                alias, target = _string(fh, path), _string(fh, path)
                if target in out:
                    out[alias] = out[target]
    return name, out


def _split(t: torch.Tensor, parts: int) -> list[torch.Tensor]:
    return list(torch.chunk(t, parts, dim=0))


def whisper_state_dict(path: Path, v: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF Whisper names (no "model." prefix) from WhisperSpec variables, as fp32."""
    for k, t in v.items():
        if t.dtype in (torch.int8, torch.int16) and t.dim() == 2:
            raise _err(path, f"{k} is {t.dtype} (an int8/int16 CTranslate2 conversion); convert "
                             "with --quantization float16 or float32 for this engine")
    f = {k: t.float() for k, t in v.items() if t.is_floating_point()}
    sd: dict[str, torch.Tensor] = {}

    def lin(dst: str, src: str, bias: bool = True) -> None:
        sd[dst + ".weight"] = f[src + "/weight"]
        if bias:
            sd[dst + ".bias"] = f[src + "/bias"]

    def ln(dst: str, src: str) -> None:
        sd[dst + ".weight"], sd[dst + ".bias"] = f[src + "/gamma"], f[src + "/beta"]

    def qkv(dst: str, src: str) -> None:
        for name, w, b in zip(("q", "k", "v"), _split(f[src + "/weight"], 3),
                              _split(f[src + "/bias"], 3)):
            sd[f"{dst}.{name}_proj.weight"] = w
            if name != "k":                             # HF's k_proj has no bias
                sd[f"{dst}.{name}_proj.bias"] = b

    for side in ("encoder", "decoder"):
        n = 0
        while f"{side}/layer_{n}/ffn/linear_0/weight" in f:
            s, d = f"{side}/layer_{n}", f"{side}.layers.{n}"
            qkv(d + ".self_attn", s + "/self_attention/linear_0")
            lin(d + ".self_attn.out_proj", s + "/self_attention/linear_1")
            ln(d + ".self_attn_layer_norm", s + "/self_attention/layer_norm")
            lin(d + ".fc1", s + "/ffn/linear_0")
            lin(d + ".fc2", s + "/ffn/linear_1")
            ln(d + ".final_layer_norm", s + "/ffn/layer_norm")
            if side == "decoder":
                lin(d + ".encoder_attn.q_proj", s + "/attention/linear_0")
                k, vv = _split(f[s + "/attention/linear_1/weight"], 2)
                kb, vb = _split(f[s + "/attention/linear_1/bias"], 2)
                sd[d + ".encoder_attn.k_proj.weight"] = k
                sd[d + ".encoder_attn.v_proj.weight"], sd[d + ".encoder_attn.v_proj.bias"] = vv, vb
                lin(d + ".encoder_attn.out_proj", s + "/attention/linear_2")
                ln(d + ".encoder_attn_layer_norm", s + "/attention/layer_norm")
            n += 1
        ln(f"{side}.layer_norm", f"{side}/layer_norm")
        sd[f"{side}.embed_positions.weight"] = f[f"{side}/position_encodings/encodings"]
    for i in (1, 2):
        lin(f"encoder.conv{i}", f"encoder/conv{i}")
    sd["decoder.embed_tokens.weight"] = f["decoder/embeddings/weight"]
    sd["proj_out.weight"] = f.get("decoder/projection/weight", sd["decoder.embed_tokens.weight"])
    return sd


def whisper_config(path: Path, sd: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> dict:
    """A HF-style Whisper config.json from the tensor shapes and the stored head counts."""
    def layers(side: str) -> int:
        return sum(1 for k in sd if k.startswith(f"{side}.layers.") and k.endswith("fc1.weight"))

    def heads(side: str) -> int:
        t = v.get(f"{side}/num_heads")
        if t is None:
            raise _err(path / "model.bin", f"{side}/num_heads missing; not a Whisper conversion")
        return int(t.item())

    d = sd["encoder.conv1.weight"].shape[0]
    return {"model_type": "whisper", "d_model": d,
            "encoder_layers": layers("encoder"), "decoder_layers": layers("decoder"),
            "encoder_attention_heads": heads("encoder"), "decoder_attention_heads": heads("decoder"),
            "encoder_ffn_dim": sd["encoder.layers.0.fc1.weight"].shape[0],
            "decoder_ffn_dim": sd["decoder.layers.0.fc1.weight"].shape[0],
            "num_mel_bins": sd["encoder.conv1.weight"].shape[1],
            "max_source_positions": sd["encoder.embed_positions.weight"].shape[0],
            "max_target_positions": sd["decoder.embed_positions.weight"].shape[0],
            "vocab_size": sd["decoder.embed_tokens.weight"].shape[0],
            "activation_function": "gelu", "scale_embedding": False}


def whisper_generation(ct2_cfg: dict) -> dict:
    """generation_config.json-style decoding controls from a CTranslate2 config.json
    (suppress_ids, suppress_ids_begin, lang_ids); the first timestamp is limited to 1 s (index
    50) as faster-whisper's max_initial_timestamp=1.0 and HF's generation configs do."""
    g: dict[str, Any] = {"max_initial_timestamp_index": 50}
    if isinstance(ct2_cfg.get("suppress_ids"), list):
        g["suppress_tokens"] = [int(x) for x in ct2_cfg["suppress_ids"]]
    if isinstance(ct2_cfg.get("suppress_ids_begin"), list):
        g["begin_suppress_tokens"] = [int(x) for x in ct2_cfg["suppress_ids_begin"]]
    if isinstance(ct2_cfg.get("lang_ids"), list):
        g["is_multilingual"] = len(ct2_cfg["lang_ids"]) > 1
    return g


def read_ct2_whisper(path: Path) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """(HF-style config, generation controls, HF-named fp32 state dict) of a CTranslate2
    Whisper directory; anything else is a ModelDirError naming the file."""
    name, v = read_model_bin(path / "model.bin")
    if name != "WhisperSpec":
        raise _err(path / "model.bin", f"a CTranslate2 {name or 'model'}, not a Whisper "
                                       "conversion (WhisperSpec)")
    if not (path / "tokenizer.json").is_file():
        raise _err(path, "no tokenizer.json beside model.bin (faster-whisper's conversions "
                         "include it: --copy_files tokenizer.json)")
    try:
        sd = whisper_state_dict(path, v)
    except KeyError as e:
        raise _err(path / "model.bin", f"variable {e.args[0]} missing; not a complete Whisper "
                                       "conversion") from None
    ct2_cfg = read_json(path / "config.json") if (path / "config.json").is_file() else {}
    return whisper_config(path, sd, v), whisper_generation(ct2_cfg), sd
