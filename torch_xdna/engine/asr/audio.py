"""Audio input on the host: decode a file (or bytes) to mono float32 samples at 16 kHz.

soundfile (libsndfile) reads WAV/FLAC/OGG and other formats it knows; everything else (MP3, M4A,
WebM...) goes through PyAV (FFmpeg). Resampling: scipy.signal.resample_poly when scipy is
installed, else our own windowed-sinc polyphase filter (the same construction: a Kaiser-windowed
sinc low-pass at the lower Nyquist rate, applied at the up/down ratio).
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000


class AudioError(ValueError):
    """The audio cannot be decoded (unsupported format, corrupt or empty file)."""


def load_audio(src: str | Path | bytes, sample_rate: int = SAMPLE_RATE,
               name: str = "") -> np.ndarray:
    """Mono float32 samples of `src` (a path or the file's bytes) at `sample_rate` Hz."""
    label = name or (str(src) if not isinstance(src, bytes) else "the uploaded audio")
    if not isinstance(src, bytes):
        p = Path(src)
        if not p.is_file():
            raise AudioError(f"{label}: no such audio file")
        data = p.read_bytes()
    else:
        data = src
    if not data:
        raise AudioError(f"{label}: the audio file is empty")
    try:
        samples, rate = _read_soundfile(data)
    except _NotMine:
        samples, rate = _read_av(data, label)
    if samples.size == 0:
        raise AudioError(f"{label}: the audio has no samples")
    if not np.isfinite(samples).all():
        raise AudioError(f"{label}: the audio holds non-finite samples (corrupt file)")
    return resample(samples, rate, sample_rate)


class _NotMine(Exception):
    """soundfile does not read this format: try PyAV."""


def _read_soundfile(data: bytes) -> tuple[np.ndarray, int]:
    try:
        import soundfile as sf
    except ImportError:
        raise _NotMine() from None
    try:
        x, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception:                 # sf.LibsndfileError / RuntimeError: not a format it reads
        raise _NotMine() from None
    return x.mean(axis=1, dtype=np.float32), int(rate)


def _read_av(data: bytes, label: str) -> tuple[np.ndarray, int]:
    try:
        import av
    except ImportError:
        raise AudioError(f"{label}: not a WAV/FLAC/OGG file, and decoding other formats (MP3, "
                         "M4A...) needs PyAV: pip install 'torch-xdna[serve]'") from None
    try:
        with av.open(io.BytesIO(data), mode="r") as box:
            streams = [s for s in box.streams if s.type == "audio"]
            if not streams:
                raise AudioError(f"{label}: the file has no audio stream")
            stream = streams[0]
            rate = int(stream.rate or stream.codec_context.sample_rate or SAMPLE_RATE)
            # PyAV converts any sample format / layout to planar mono float32 at the source rate
            conv = av.AudioResampler(format="flt", layout="mono", rate=rate)
            parts = []
            for frame in box.decode(stream):
                for out in conv.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
            for out in conv.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except AudioError:
        raise
    except Exception as e:            # av.error.InvalidDataError and friends
        raise AudioError(f"{label}: not a decodable audio file ({type(e).__name__}); supported: "
                         "WAV, FLAC, OGG, MP3 and the other formats FFmpeg reads") from None
    x = np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
    return x, rate


def resample(x: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """`x` from `rate` to `target` Hz (float32)."""
    if rate <= 0:
        raise AudioError(f"invalid sample rate {rate}")
    if rate == target:
        return np.ascontiguousarray(x, dtype=np.float32)
    g = math.gcd(rate, target)
    up, down = target // g, rate // g
    try:
        from scipy.signal import resample_poly
        return resample_poly(x, up, down).astype(np.float32)
    except ImportError:
        return _resample_poly(x, up, down).astype(np.float32)


def _resample_poly(x: np.ndarray, up: int, down: int, half_width: int = 10,
                   beta: float = 5.0) -> np.ndarray:
    """Polyphase resampling by up/down with a Kaiser-windowed sinc low-pass (scipy's design:
    cutoff at 1/max(up, down) of the upsampled Nyquist, `half_width` zero crossings a side)."""
    m = max(up, down)
    n_half = half_width * m
    t = np.arange(-n_half, n_half + 1, dtype=np.float64)
    h = np.sinc(t / m) * np.kaiser(2 * n_half + 1, beta)
    h *= up / h.sum()
    n_out = -(-len(x) * up // down)
    out = np.empty(n_out, dtype=np.float64)
    xd = x.astype(np.float64)
    # output sample j sits at upsampled index j*down; it sums x[i] * h[j*down - i*up + n_half]
    for j0 in range(0, n_out, 4096):
        j = np.arange(j0, min(n_out, j0 + 4096))
        centre = j * down
        lo = np.ceil((centre - n_half) / up).astype(np.int64)
        span = 2 * n_half // up + 2
        idx = lo[:, None] + np.arange(span)[None, :]
        taps = centre[:, None] - idx * up + n_half
        ok = (idx >= 0) & (idx < len(xd)) & (taps >= 0) & (taps <= 2 * n_half)
        vals = np.where(ok, xd[np.clip(idx, 0, len(xd) - 1)] * h[np.clip(taps, 0, 2 * n_half)], 0.0)
        out[j] = vals.sum(1)
    return out
