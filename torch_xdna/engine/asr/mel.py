"""Whisper's log-mel front end on the host (what transformers' WhisperFeatureExtractor computes).

STFT (Hann window of n_fft, hop, centred with reflect padding; the last frame dropped), power
spectrum, mel filters (the directory's preprocessor_config "mel_filters" when it stores them,
else Slaney-scale Slaney-normalized triangles from 0 to 8 kHz), log10 clamped at 1e-10, then
clamped to (max - 8) and scaled (x + 4) / 4. A window is 30 s (n_samples), zero-padded.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from torch_xdna.models.hf import read_json


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    mel = 3.0 * f / 200.0
    log_step = 27.0 / np.log(6.4)
    return np.where(f >= 1000.0, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) * log_step, mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(m >= 15.0, 1000.0 * np.exp(log_step * (m - 15.0)), 200.0 * m / 3.0)


def mel_filters(n_mels: int, n_fft: int, sample_rate: int, f_max: float = 8000.0) -> np.ndarray:
    """[n_fft // 2 + 1, n_mels] triangular filters, Slaney scale, Slaney (area) normalization."""
    fft_freqs = np.linspace(0, sample_rate // 2, n_fft // 2 + 1)
    mels = np.linspace(_hz_to_mel(0.0), _hz_to_mel(f_max), n_mels + 2)
    edges = _mel_to_hz(mels)
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    bank = np.maximum(0.0, np.minimum(down, up))
    return bank * (2.0 / (edges[2:n_mels + 2] - edges[:n_mels]))[None, :]


@dataclass
class LogMel:
    """The front end of one model directory (preprocessor_config.json; Whisper defaults)."""

    n_mels: int = 80
    n_fft: int = 400
    hop: int = 160
    sample_rate: int = 16000
    chunk_s: int = 30
    filters: np.ndarray | None = None      # [n_fft // 2 + 1, n_mels]

    def __post_init__(self):
        if self.filters is None:
            self.filters = mel_filters(self.n_mels, self.n_fft, self.sample_rate)
        self._filters_t = torch.from_numpy(np.asarray(self.filters, dtype=np.float32)).T.contiguous()
        self._window = torch.hann_window(self.n_fft)

    @classmethod
    def from_dir(cls, model_dir: str | Path, n_mels: int) -> "LogMel":
        path = Path(model_dir) / "preprocessor_config.json"
        cfg = read_json(path) if path.is_file() else {}
        mel = cfg.get("feature_size", n_mels)
        if mel != n_mels:
            raise ValueError(f"{path}: feature_size {mel} does not match the model's num_mel_bins "
                             f"{n_mels}; the directory mixes two models")
        filters = cfg.get("mel_filters")
        return cls(n_mels=n_mels, n_fft=int(cfg.get("n_fft", 400)),
                   hop=int(cfg.get("hop_length", 160)),
                   sample_rate=int(cfg.get("sampling_rate", 16000)),
                   chunk_s=int(cfg.get("chunk_length", 30)),
                   filters=np.asarray(filters, dtype=np.float64) if filters else None)

    @property
    def n_samples(self) -> int:
        return self.chunk_s * self.sample_rate

    @property
    def n_frames(self) -> int:
        """Mel frames in one window (3000 for 30 s at hop 160)."""
        return self.n_samples // self.hop

    def __call__(self, audio: np.ndarray, pad_to_window: bool = True) -> torch.Tensor:
        """[n_mels, frames] log-mel of `audio` (float32, at sample_rate). pad_to_window: zero-pad
        (or cut) to one 30-s window first, as the feature extractor does; else pad by one window
        at the end (long-form: windows are then sliced from this one spectrogram)."""
        x = torch.as_tensor(np.asarray(audio, dtype=np.float32))
        n = self.n_samples
        if pad_to_window:
            x = torch.nn.functional.pad(x[:n], (0, max(0, n - x.numel())))
        else:
            x = torch.nn.functional.pad(x, (0, n))
        stft = torch.stft(x, self.n_fft, self.hop, window=self._window, return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()
        spec = torch.clamp(self._filters_t @ power, min=1e-10).log10()
        spec = torch.maximum(spec, spec.max() - 8.0)
        return (spec + 4.0) / 4.0

    def window(self, spec: torch.Tensor, seek: int) -> torch.Tensor:
        """The [n_mels, n_frames] window of a long spectrogram starting at frame `seek`."""
        w = spec[:, seek:seek + self.n_frames]
        if w.shape[1] < self.n_frames:
            w = torch.nn.functional.pad(w, (0, self.n_frames - w.shape[1]))
        return w.contiguous()

    def frames_of(self, n_samples: int) -> int:
        return math.ceil(n_samples / self.hop)
