"""One loader for every speech model: the directory's config picks the engine (Whisper:
engine/asr/transcribe.Transcriber; Parakeet CTC / TDT: engine/asr/parakeet_asr.ParakeetTranscriber),
so `xdna transcribe` and /v1/audio/transcriptions run each model with its own decoding."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from torch_xdna.models.speech.parakeet import is_parakeet_dir


def load_transcriber(model_dir: str | Path, precision: Any = "bf16", device=None,
                     budget=None, quiet: bool = False):
    """A Transcriber (Whisper) or ParakeetTranscriber for `model_dir`, loaded on `device`."""
    from torch_xdna.models.packaged import resolve
    path = resolve(model_dir)
    if is_parakeet_dir(path):
        from torch_xdna.engine.asr.parakeet_asr import ParakeetTranscriber
        return ParakeetTranscriber.load(path, precision, device)
    from torch_xdna.engine.asr.transcribe import Transcriber
    return Transcriber.load(model_dir, precision, device, budget=budget, quiet=quiet)


def check_asr_dir(model_dir: str | Path) -> None:
    """Read a speech model's config (a bad directory fails here, before any weight is read)."""
    if is_parakeet_dir(model_dir):
        from torch_xdna.models.speech.parakeet import read_parakeet
        read_parakeet(model_dir)
    else:
        from torch_xdna.models.speech.whisper import read_whisper
        read_whisper(model_dir)
