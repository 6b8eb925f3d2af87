"""Speech to text on a resident WhisperModel: prompt tokens, decoding rules, timestamps, long audio.

Per 30-s window: the encoder Program runs once; the decoder starts from
[<|startofprev|> prompt...] <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>] and
generates greedily (temperature 0) or by sampling, with the rules transformers' Whisper generate
applies (begin-suppress and suppress tokens, and with timestamps: timestamps in pairs,
non-decreasing, the first token a timestamp, and a timestamp forced when their total probability
beats every text token). Timestamp tokens become segments; long audio is cut into 30-s windows,
each starting where the last complete segment of the previous one ended (or at its end).

    asr = Transcriber.load("whisper-dir")
    result = asr.transcribe("meeting.mp3", TranscribeOptions(timestamps=True))
    result.text, result.language, result.segments
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np
import torch

from torch_xdna.records import Record
from torch_xdna.engine.asr.audio import SAMPLE_RATE, load_audio
from torch_xdna.engine.counters import CounterDelta
from torch_xdna.engine.llm.sampler import Sampler, SamplingParams
from torch_xdna.engine.asr.whisper import WhisperModel, load_whisper_model
from torch_xdna.models.speech.whisper import TIMESTAMP_STEP_S
from torch_xdna.runtime import Device

if TYPE_CHECKING:
    from torch_xdna.engine.precision_auto import Budget

TASKS = ("transcribe", "translate")
# ISO code -> name, for the languages a user is most likely to name (others: pass the code)
LANGUAGE_NAMES = {
    "en": "english", "zh": "chinese", "de": "german", "es": "spanish", "ru": "russian",
    "ko": "korean", "fr": "french", "ja": "japanese", "pt": "portuguese", "tr": "turkish",
    "pl": "polish", "ca": "catalan", "nl": "dutch", "ar": "arabic", "sv": "swedish",
    "it": "italian", "id": "indonesian", "hi": "hindi", "fi": "finnish", "vi": "vietnamese",
    "he": "hebrew", "uk": "ukrainian", "el": "greek", "ms": "malay", "cs": "czech",
    "ro": "romanian", "da": "danish", "hu": "hungarian", "ta": "tamil", "no": "norwegian",
    "th": "thai", "ur": "urdu", "hr": "croatian", "bg": "bulgarian", "lt": "lithuanian",
}


class TranscriberBusy(RuntimeError):
    """A transcription is already running on this model."""


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None        # code ("en"), name ("english") or None: detect
    task: str = "transcribe"           # or "translate" (to English)
    temperature: float = 0.0           # 0: greedy
    seed: int | None = None
    timestamps: bool = False           # timestamp tokens -> segment times
    prompt: str | None = None          # text before <|startoftranscript|> (vocabulary, style)
    max_new_tokens: int | None = None  # per window (default: what the 448 positions allow)


@dataclass
class Segment(Record):
    id: int
    start: float
    end: float
    text: str
    tokens: list[int]
    seek: int = 0
    temperature: float = 0.0
    avg_logprob: float = 0.0


@dataclass
class TranscribeStats:
    """measured_*: wall clock on this host; modeled_*: the simulator's NPU cost model."""

    windows: int = 0
    tokens: int = 0
    measured_total_s: float = 0.0
    measured_frontend_s: float = 0.0
    modeled_encoder_ms_per_window: float = 0.0
    modeled_decoder_ms_per_token: float = 0.0
    modeled_total_ms: float = 0.0
    dispatches: int = 0


@dataclass
class Transcription:
    text: str
    language: str | None
    duration: float
    segments: list[Segment] = field(default_factory=list)
    task: str = "transcribe"
    stats: TranscribeStats = field(default_factory=TranscribeStats)
    window_tokens: list[list[int]] = field(default_factory=list)   # per window: prompt + output


class Transcriber:
    """A WhisperModel plus its tokenizer and decoding rules. One transcription at a time."""

    def __init__(self, model: WhisperModel, max_new_tokens: int | None = None):
        self.model = model
        self.max_new_tokens = max_new_tokens      # per-window cap when the options set none
        self.t = model.tokens
        path = model.files.path / "tokenizer.json"
        self.tokenizer = None
        if path.is_file():
            from tokenizers import Tokenizer
            self.tokenizer = Tokenizer.from_file(str(path))
        self._lock = threading.Lock()

    @classmethod
    def load(cls, model_dir: str | Path, precision: "str | Mapping[str, str]" = "bf16",
             device: Device | None = None, budget: "Budget | str | None" = None,
             quiet: bool = False) -> "Transcriber":
        """precision: bf16 | int8 | fp32 (verification mode) | {"encoder": ..., "decoder": ...}
        | auto: per encoder/decoder the cheapest modeled precision whose WER on the shipped
        speech set stays within `budget` of fp32's, measured once and saved beside the model
        (engine/precision_auto.py)."""
        if precision == "auto":
            import logging
            from torch_xdna.engine.precision_auto import choose_whisper, stderr_log
            from torch_xdna.models.speech.whisper import read_whisper
            path = read_whisper(model_dir).path
            log = logging.getLogger("torch_xdna.precision").info if quiet else stderr_log
            precision = choose_whisper(path, lambda p: cls.load(path, p, device),
                                       TranscribeOptions(language="en"), budget=budget,
                                       log=log).policy()
        return cls(load_whisper_model(model_dir, precision, device))

    @property
    def name(self) -> str:
        return self.model.files.path.name

    def close(self) -> None:
        self.model.close()

    # -- tokens ----------------------------------------------------------------------------
    def language_token(self, language: str) -> int:
        lang = language.strip().lower()
        code = next((c for c, n in LANGUAGE_NAMES.items() if n == lang), lang)
        for key in (lang, f"<|{code}|>"):
            if key in self.t.lang_to_id:
                return self.t.lang_to_id[key]
        known = ", ".join(k[2:-2] for k in list(self.t.lang_to_id)[:20])
        raise ValueError(f"language {language!r} is not one this model knows"
                         + (f" (it knows: {known}...)" if known else
                            " (it has no language tokens; omit --language)"))

    def text_of(self, ids: list[int]) -> str:
        """Text of the text tokens of `ids` (ids below <|endoftext|>; specials dropped)."""
        text_ids = [i for i in ids if i < self.t.eos]
        if self.tokenizer is None:
            return " ".join(str(i) for i in text_ids)
        return self.tokenizer.decode(text_ids, skip_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self.model.files.path}: no tokenizer.json; a text prompt needs one")
        ids = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False).ids
        return [i for i in ids if i < self.t.eos]

    def init_tokens(self, language_id: int | None, task: str, timestamps: bool) -> list[int]:
        """<|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>] (what the model has)."""
        if task not in TASKS:
            raise ValueError(f"task {task!r}; use one of {', '.join(TASKS)}")
        ids = [self.t.start]
        if language_id is not None:
            ids.append(language_id)
        if self.t.task_to_id and (language_id is not None or task != "transcribe"):
            if task not in self.t.task_to_id:
                raise ValueError(f"this model has no {task} task token")
            ids.append(self.t.task_to_id[task])
        if not timestamps and self.t.no_timestamps is not None:
            ids.append(self.t.no_timestamps)
        return ids

    def detect_language(self, mel_window: torch.Tensor | None = None) -> int | None:
        """The most likely language token for the encoded window (None: the model has none)."""
        if not self.t.lang_to_id or not self.t.is_multilingual:
            return None
        if mel_window is not None:
            self.model.encode(mel_window)
        self.model.reset()
        logits = self.model.forward([self.t.start])
        ids = torch.tensor(sorted(self.t.lang_to_id.values()))
        return int(ids[torch.argmax(logits[ids])])

    # -- one window ------------------------------------------------------------------------
    def decode_window(self, prefix: list[int], begin: int, options: TranscribeOptions,
                      sampler: Sampler, max_new: int) -> tuple[list[int], float]:
        """Generate after `prefix` on the encoded window: (tokens without eos, mean logprob)."""
        m, t = self.model, self.t
        m.reset()
        logits = m.forward(prefix)
        seq = list(prefix)
        out: list[int] = []
        logprob = 0.0
        suppress = torch.tensor(t.suppress, dtype=torch.long) if t.suppress else None
        begin_suppress = torch.tensor(t.begin_suppress, dtype=torch.long) if t.begin_suppress else None
        for step in range(max_new):
            x = logits.clone()
            if begin_suppress is not None and len(seq) == begin:
                x[begin_suppress] = -float("inf")
            if suppress is not None:
                x[suppress] = -float("inf")
            if options.timestamps and t.no_timestamps is not None:
                x = self._timestamp_rules(x, seq[begin:], len(seq) == begin)
            token = sampler(x)
            logprob += float(torch.log_softmax(x, -1)[token])
            if token == t.eos:
                break
            out.append(token)
            seq.append(token)
            if step + 1 < max_new and len(seq) < m.capacity:
                logits = m.forward([token])
            else:
                break
        return out, logprob / max(1, len(out))

    def _timestamp_rules(self, x: torch.Tensor, seq: list[int], first: bool) -> torch.Tensor:
        """transformers' WhisperTimeStampLogitsProcessor for one row."""
        t = self.t
        tb = t.timestamp_begin
        x[t.no_timestamps] = -float("inf")
        last_ts = len(seq) >= 1 and seq[-1] >= tb
        pen_ts = len(seq) < 2 or seq[-2] >= tb
        if last_ts:
            if pen_ts:
                x[tb:] = -float("inf")
            else:
                x[:t.eos] = -float("inf")
        stamps = [s for s in seq if s >= tb]
        if stamps:
            floor = stamps[-1] if last_ts and not pen_ts else stamps[-1] + 1
            x[tb:floor] = -float("inf")
        if first:
            x[:tb] = -float("inf")
            if t.max_initial_timestamp_index is not None:
                x[tb + t.max_initial_timestamp_index + 1:] = -float("inf")
        lp = torch.log_softmax(x.float(), -1)
        if lp[tb:].logsumexp(-1) > lp[:tb].max():
            x[:tb] = -float("inf")
        return x

    # -- whole audio -----------------------------------------------------------------------
    def transcribe(self, audio: "np.ndarray | str | Path | bytes", options: TranscribeOptions
                   | None = None, name: str = "") -> Transcription:
        """Transcribe (or translate) audio: samples at 16 kHz, a file path, or file bytes."""
        options = options or TranscribeOptions()
        if options.task not in TASKS:
            raise ValueError(f"task {options.task!r}; use one of {', '.join(TASKS)}")
        SamplingParams(options.temperature, seed=options.seed).validate()
        if not self._lock.acquire(blocking=False):
            raise TranscriberBusy("a transcription is already running on this model")
        try:
            return self._transcribe(audio, options, name)
        finally:
            self._lock.release()

    def _transcribe(self, audio, options: TranscribeOptions, name: str) -> Transcription:
        m, t = self.model, self.t
        t0 = time.perf_counter()
        samples = audio if isinstance(audio, np.ndarray) else load_audio(audio, SAMPLE_RATE, name)
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        duration = len(samples) / SAMPLE_RATE
        mel = m.mel(samples, pad_to_window=False)
        t_front = time.perf_counter() - t0
        content = m.mel.frames_of(len(samples))
        frames = m.mel.n_frames
        lang_id = self.language_token(options.language) if options.language else None
        sampler = Sampler(SamplingParams(options.temperature, seed=options.seed))
        prompt = self.encode_text(options.prompt) if options.prompt else []
        total = CounterDelta(m.dev)
        enc_us, tokens_total, windows = 0.0, 0, 0
        segments: list[Segment] = []
        window_tokens: list[list[int]] = []
        seek = 0
        while seek < max(content, 1):
            window = m.mel.window(mel, seek)
            encoder = CounterDelta(m.dev)
            m.encode(window)
            enc_us += encoder.take()["modeled_us"]
            windows += 1
            if lang_id is None and options.language is None and t.is_multilingual and t.lang_to_id:
                lang_id = self.detect_language()
            init = self.init_tokens(lang_id, options.task, options.timestamps)
            prefix = ([t.prev] + prompt[-(m.capacity // 2 - 1):] if prompt and t.prev is not None
                      else []) + init
            budget = m.capacity - len(prefix)
            cap = options.max_new_tokens if options.max_new_tokens is not None else self.max_new_tokens
            if cap is not None:
                budget = min(budget, cap)
            ids, avg_lp = self.decode_window(prefix, len(prefix), options, sampler, budget)
            window_tokens.append(prefix + ids)
            tokens_total += len(ids)
            size = min(frames, content - seek) if content > seek else frames
            new, advance = self._segments(ids, seek, size, avg_lp, options)
            for s in new:
                if s.text.strip():
                    s.id = len(segments)
                    segments.append(s)
            seek += max(1, advance)
        stats = TranscribeStats(windows=windows, tokens=tokens_total)
        stats.measured_total_s = time.perf_counter() - t0
        stats.measured_frontend_s = t_front
        spent = total.take()
        total_us = spent["modeled_us"]
        stats.dispatches = spent["dispatches"]
        stats.modeled_total_ms = total_us / 1e3
        stats.modeled_encoder_ms_per_window = enc_us / 1e3 / max(1, windows)
        if tokens_total:
            stats.modeled_decoder_ms_per_token = (total_us - enc_us) / 1e3 / tokens_total
        lang = None
        if lang_id is not None:
            lang = next((k[2:-2] for k, v in t.lang_to_id.items() if v == lang_id), None)
        text = "".join(s.text for s in segments).strip()
        return Transcription(text, lang, duration, segments, options.task, stats, window_tokens)

    def _segments(self, ids: list[int], seek: int, size: int, avg_lp: float,
                  options: TranscribeOptions) -> tuple[list[Segment], int]:
        """Segments of one window's tokens and how many mel frames to advance: transformers'
        (and openai's) rule. Consecutive timestamps close a segment; a window ending in a single
        timestamp is complete, else decoding resumes at its last timestamp."""
        hop_s = self.model.mel.hop / self.model.mel.sample_rate
        offset = seek * hop_s
        frames_per_step = round(TIMESTAMP_STEP_S / hop_s)
        tb = self.t.timestamp_begin
        temp = options.temperature

        def mk(a: float, b: float, toks: list[int]) -> Segment:
            return Segment(0, round(a, 3), round(b, 3), self.text_of(toks), toks, seek, temp, avg_lp)

        is_ts = [tb is not None and i >= tb for i in ids]
        single_end = is_ts[-2:] == [False, True]
        cuts = [i + 1 for i in range(len(ids) - 1) if is_ts[i] and is_ts[i + 1]]
        if cuts:
            slices = cuts + [len(ids)] if single_end else cuts[:-1] + [cuts[-1] + 1]
            segs, last = [], 0
            for j, cut in enumerate(slices):
                part = ids[last:cut]
                end_idx = -1 if j < len(slices) - 1 or single_end else -2
                segs.append(mk(offset + (part[0] - tb) * TIMESTAMP_STEP_S,
                               offset + (part[end_idx] - tb) * TIMESTAMP_STEP_S, part))
                last = cut
            if single_end:
                return segs, size
            return segs, (ids[last - 2] - tb) * frames_per_step
        end = offset + size * hop_s
        stamps = [i for i, t in zip(ids, is_ts) if t]
        if stamps and stamps[-1] != tb:
            end = offset + (stamps[-1] - tb) * TIMESTAMP_STEP_S
        return [mk(offset, end, ids)], size
