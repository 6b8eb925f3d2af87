"""Speech to text with a resident ParakeetModel: the model's own decoding (CTC greedy, or TDT
greedy with the transducer's prediction and joint networks), long audio in overlapping windows.

The features of the whole utterance are computed once (transformers normalizes each mel bin
over the whole input, so a window's features are those of the whole audio, sliced). Audio
longer than one window (30 s) is cut into windows of `window` mel frames that overlap by
`overlap` frames (4 s), starting at multiples of the 8x subsampling so that encoder frames line
up; each encoder frame is taken from the window where it lies furthest from an edge (the
overlap is split at its middle), so no frame is counted twice and none sees a window edge
closer than overlap/2. The frames of all windows are then decoded as one sequence: CTC
collapses repeats and drops blanks; TDT walks the frames with its predicted durations, its
prediction-network state carried across window boundaries.

    asr = ParakeetTranscriber.load("parakeet-dir")
    r = asr.transcribe("meeting.flac")         # engine/asr/transcribe.Transcription
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from torch_xdna.engine.asr.audio import SAMPLE_RATE, load_audio
from torch_xdna.engine.asr.fbank import ParakeetFeatures
from torch_xdna.engine.asr.parakeet import MAX_WINDOW_FRAMES, ParakeetModel, host_weights
from torch_xdna.engine.asr.transcribe import (Segment, TranscribeOptions, TranscribeStats,
                                              Transcription, TranscriberBusy)
from torch_xdna.engine.counters import CounterDelta
from torch_xdna.models.speech.parakeet import load_parakeet_weights, read_parakeet
from torch_xdna.runtime import Device

OVERLAP_FRAMES = 400             # 4 s of mel frames shared by consecutive windows


@dataclass(frozen=True)
class Window:
    """One encoder window in mel frames [start, end) and the encoder frames it contributes,
    [keep_from, keep_to) in the window's own frame numbering."""

    start: int
    end: int
    keep_from: int
    keep_to: int | None          # None: to the window's last frame


def plan_windows(frames: int, window: int, overlap: int, factor: int) -> list[Window]:
    """The windows covering `frames` mel frames (see the module docstring)."""
    if window % factor or overlap % (2 * factor) or not 0 <= overlap < window:
        raise ValueError(f"window {window} / overlap {overlap} frames must be multiples of "
                         f"{factor} / {2 * factor}, the overlap shorter than the window")
    if frames <= window:
        return [Window(0, frames, 0, None)]
    step = window - overlap
    starts = [0]
    while starts[-1] + window < frames:
        starts.append(starts[-1] + step)
    cuts = [0] + [s + overlap // 2 for s in starts[1:]] + [None]
    out = []
    for k, s in enumerate(starts):
        end = min(s + window, frames)
        to = None if cuts[k + 1] is None else (cuts[k + 1] - s) // factor
        out.append(Window(s, end, (cuts[k] - s) // factor if k else 0, to))
    return out


def ctc_collapse(ids: list[int], blank: int) -> list[tuple[int, int]]:
    """(token, frame) of greedy CTC: repeats merged, blanks dropped."""
    out, prev = [], None
    for t, i in enumerate(ids):
        if i != prev and i != blank:
            out.append((i, t))
        prev = i
    return out


class ParakeetTranscriber:
    """A ParakeetModel plus its front end, tokenizer and decoding. One transcription at a time.
    The interface of engine/asr/transcribe.Transcriber (transcribe, close, name, model.dev)."""

    def __init__(self, model: ParakeetModel, overlap: int = OVERLAP_FRAMES,
                 sd: dict[str, torch.Tensor] | None = None):
        self.model = model
        self.spec = model.spec
        self.features = ParakeetFeatures(model.files.front)
        self.window = model.max_frames - model.max_frames % self.spec.sub_factor
        self.overlap = overlap
        self.tokenizer = None
        path = model.files.path / "tokenizer.json"
        if path.is_file():
            from tokenizers import Tokenizer
            self.tokenizer = Tokenizer.from_file(str(path))
        self.decoder = None
        if self.spec.head == "tdt":
            from torch_xdna.engine.asr.transducer import TdtDecoder
            self.decoder = TdtDecoder(model, sd)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model_dir: str | Path, precision: str = "bf16", device: Device | None = None,
             max_frames: int = MAX_WINDOW_FRAMES, overlap: int = OVERLAP_FRAMES,
             **_: object) -> "ParakeetTranscriber":
        """precision: bf16 (the NPU's numerics) or fp32 (verification mode); "auto" is bf16
        (Parakeet has no cheaper precision yet, so there is nothing to choose)."""
        if precision == "auto":
            precision = "bf16"
        if precision not in ("bf16", "fp32"):
            raise ValueError(f"Parakeet runs in bf16 (or fp32, the verification mode); "
                             f"precision {precision!r} is not supported for it")
        files = read_parakeet(model_dir)
        sd = load_parakeet_weights(files)              # read once: encoder and TDT networks
        model = ParakeetModel(files, host_weights(files.spec, sd, precision), precision, device,
                              max_frames)
        try:
            return cls(model, overlap, sd)
        except BaseException:
            model.close()
            raise

    @property
    def name(self) -> str:
        return self.model.files.path.name

    def close(self) -> None:
        self.model.close()           # the TDT decoder's buffers too

    def text_of(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # -- whole audio -----------------------------------------------------------------------
    def transcribe(self, audio: "np.ndarray | str | Path | bytes",
                   options: TranscribeOptions | None = None, name: str = "") -> Transcription:
        """Transcribe audio (samples at 16 kHz, a path, or file bytes), greedily."""
        options = options or TranscribeOptions()
        if options.task != "transcribe":
            raise ValueError("Parakeet transcribes only (it has no translate task)")
        if options.temperature:
            raise ValueError("Parakeet decodes greedily (CTC / TDT): temperature must be 0")
        if options.prompt:
            raise ValueError("Parakeet takes no text prompt")
        if not self._lock.acquire(blocking=False):
            raise TranscriberBusy("a transcription is already running on this model")
        try:
            return self._transcribe(audio, name)
        finally:
            self._lock.release()

    def frames(self, feats: torch.Tensor) -> tuple[torch.Tensor, int, float]:
        """The head's outputs of every encoder frame of the utterance [T, N], the number of
        windows, and the modeled encoder microseconds."""
        m = self.model
        parts, enc_us = [], 0.0
        wins = plan_windows(feats.shape[0], self.window, self.overlap, self.spec.sub_factor)
        for w in wins:
            delta = CounterDelta(m.dev)
            out = m.encode(feats[w.start:w.end])
            enc_us += delta.take()["modeled_us"]
            parts.append(out[w.keep_from:w.keep_to])
        return torch.cat(parts), len(wins), enc_us

    def _transcribe(self, audio, name: str) -> Transcription:
        m = self.model
        t0 = time.perf_counter()
        samples = audio if isinstance(audio, np.ndarray) else load_audio(audio, SAMPLE_RATE, name)
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        feats = self.features(samples)
        t_front = time.perf_counter() - t0
        total = CounterDelta(m.dev)
        frames, windows, enc_us = self.frames(feats)
        if self.decoder is None:
            tokens = ctc_collapse(frames.argmax(-1).tolist(), self.spec.blank)
        else:
            tokens = self.decoder.decode(frames)
        spent = total.take()
        frame_s = self.features.fe.hop * self.spec.sub_factor / self.features.fe.sample_rate
        duration = len(samples) / SAMPLE_RATE
        segments = self._segments(tokens, frames.shape[0], frame_s, duration)
        stats = TranscribeStats(windows=windows, tokens=len(tokens))
        stats.measured_total_s = time.perf_counter() - t0
        stats.measured_frontend_s = t_front
        stats.dispatches = spent["dispatches"]
        stats.modeled_total_ms = spent["modeled_us"] / 1e3
        stats.modeled_encoder_ms_per_window = enc_us / 1e3 / max(1, windows)
        if tokens:
            stats.modeled_decoder_ms_per_token = (spent["modeled_us"] - enc_us) / 1e3 / len(tokens)
        ids = [t for t, _ in tokens]
        text = self.text_of(ids).strip()
        return Transcription(text, None, duration, segments, "transcribe", stats, [ids])

    def _segments(self, tokens: list[tuple[int, int]], n_frames: int, frame_s: float,
                  duration: float, max_s: float = 10.0) -> list[Segment]:
        """Segments of at most `max_s` seconds, cut at word starts ("▁" pieces) where the
        tokenizer has them, timed by their tokens' encoder frames."""
        segs: list[Segment] = []
        cur: list[tuple[int, int]] = []

        def flush(end: float) -> None:
            if cur:
                text = self.text_of([t for t, _ in cur])
                start = round(cur[0][1] * frame_s, 3)
                if text.strip():
                    segs.append(Segment(len(segs), start, min(round(max(end, start), 3), duration),
                                        " " + text.strip(), [t for t, _ in cur]))
            cur.clear()

        for tok, frame in tokens:
            word = self.tokenizer is None or self.tokenizer.id_to_token(tok).startswith("▁")
            if cur and word and (frame - cur[0][1]) * frame_s >= max_s:
                flush(frame * frame_s)
            cur.append((tok, frame))
        flush(min(duration, n_frames * frame_s))
        return segs
