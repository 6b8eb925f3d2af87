"""Parakeet's log-mel front end on the host (what transformers' ParakeetFeatureExtractor, i.e.
NeMo's AudioToMelSpectrogramPreprocessor, computes), the same ops in the same order:

pre-emphasis x[t] - 0.97 x[t-1]; STFT (n_fft 512, a symmetric Hann window of 400 samples
centred in it, hop 160, centred with zero padding); power |X|^2 as sqrt(re^2 + im^2)^2;
Slaney-scale Slaney-normalized mel filters over 0..sr/2; ln(mel + 2^-24); then each mel bin
normalized over the utterance's valid frames (L // hop of them: the STFT's last, centred frame
is padding) by its mean and unbiased standard deviation (+1e-5).

The features are returned time-major [frames, n_mels] for the valid frames only: the encoder
computes over exactly those (transformers masks the padding frame; the values it produces for
the valid frames are the same).
"""
from __future__ import annotations

import numpy as np
import torch

from torch_xdna.engine.asr.mel import mel_filters
from torch_xdna.models.speech.parakeet import FrontEnd

LOG_GUARD = 2.0 ** -24
NORM_EPS = 1e-5


class ParakeetFeatures:
    """The front end of one Parakeet directory (models/parakeet.FrontEnd)."""

    def __init__(self, fe: FrontEnd):
        self.fe = fe
        bank = mel_filters(fe.n_mels, fe.n_fft, fe.sample_rate, f_max=fe.sample_rate / 2)
        self._filters = torch.from_numpy(np.ascontiguousarray(bank.T.astype(np.float32)))
        self._window = torch.hann_window(fe.win_length, periodic=False)

    def valid_frames(self, n_samples: int) -> int:
        fe = self.fe
        return (n_samples + fe.n_fft // 2 * 2 - fe.n_fft) // fe.hop

    def log_mel(self, audio: np.ndarray) -> torch.Tensor:
        """[frames, n_mels] natural-log mel energies before normalization (every STFT frame)."""
        fe = self.fe
        x = torch.as_tensor(np.asarray(audio, dtype=np.float32)).reshape(1, -1)
        if fe.preemphasis:
            x = torch.cat([x[:, :1], x[:, 1:] - fe.preemphasis * x[:, :-1]], dim=1)
        stft = torch.stft(x, fe.n_fft, hop_length=fe.hop, win_length=fe.win_length,
                          window=self._window, return_complex=True, pad_mode="constant")
        mag = torch.sqrt(torch.view_as_real(stft).pow(2).sum(-1)).pow(2)
        return torch.log(self._filters @ mag + LOG_GUARD)[0].transpose(0, 1)

    def __call__(self, audio: np.ndarray) -> torch.Tensor:
        """Normalized features [valid frames, n_mels] (float32) of 16-kHz mono `audio`."""
        n = self.valid_frames(len(audio))
        if n < 2:
            raise ValueError(f"{len(audio)} samples is too short for Parakeet's front end "
                             f"(at least {2 * self.fe.hop} are needed)")
        spec = self.log_mel(audio)
        valid = spec[:n]
        mean = valid.sum(0) / n
        var = ((valid - mean) ** 2).sum(0) / (n - 1)
        return ((valid - mean) / (torch.sqrt(var) + NORM_EPS)).contiguous()
