"""Transcription output formats: text, json, verbose_json (OpenAI's fields), SRT and WebVTT."""
from __future__ import annotations

import json

from torch_xdna.engine.asr.transcribe import Transcription

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


def _stamp(t: float, sep: str) -> str:
    ms = int(round(max(t, 0.0) * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def to_srt(r: Transcription) -> str:
    blocks = [f"{i + 1}\n{_stamp(s.start, ',')} --> {_stamp(s.end, ',')}\n{s.text.strip()}\n"
              for i, s in enumerate(r.segments)]
    return "\n".join(blocks)


def to_vtt(r: Transcription) -> str:
    blocks = [f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}\n{s.text.strip()}\n"
              for s in r.segments]
    return "WEBVTT\n\n" + "\n".join(blocks)


def verbose(r: Transcription) -> dict:
    return {"task": r.task, "language": r.language, "duration": round(r.duration, 3),
            "text": r.text,
            "segments": [{"id": s.id, "seek": s.seek, "start": s.start, "end": s.end,
                          "text": s.text, "tokens": s.tokens, "temperature": s.temperature,
                          "avg_logprob": round(s.avg_logprob, 4)} for s in r.segments]}


def render(r: Transcription, fmt: str) -> str:
    """The response body of `fmt` (json formats as JSON text)."""
    if fmt == "text":
        return r.text + "\n"
    if fmt == "srt":
        return to_srt(r)
    if fmt == "vtt":
        return to_vtt(r)
    if fmt == "json":
        return json.dumps({"text": r.text})
    if fmt == "verbose_json":
        return json.dumps(verbose(r))
    raise ValueError(f"unknown response format {fmt!r}; use one of {', '.join(FORMATS)}")
