"""Accuracy per precision mode on real checkpoints, with the modeled NPU time of each mode.

Why: the precision modes trade accuracy for modeled speed, and on real weights the trade is not
the same per model (Whisper-base's bf16 drifts on some clips, gemma-3-270m's greedy path leaves
fp32's). What is measured, each against the fp32 verification mode of the same engine:
  - decoders: perplexity teacher-forced over a real English text (the CPython Language
    Reference's "exceptions" topic, shipped in every Python as pydoc_data.topics) and next-token
    (argmax) agreement with fp32 at every position; modeled NPU ms per decode step;
  - Whisper: word error rate on a speech set (a folder with transcripts.json); modeled NPU ms per
    30-s window (encoder + the clip's decode steps);
  - embedders: cosine of the engine's vectors (bf16, its only mode) to sentence-transformers in
    fp32 over the text's sentences; modeled NPU ms per sentence.
Accuracy figures are measured on this host; times are modeled by the simulator.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable

import torch

from torch_xdna.engine.counters import CounterDelta
from torch_xdna.kernels.blocks.weights import WHISPER_PRECISIONS  # noqa: F401  (the modes measured)
from torch_xdna.runtime import get_device

DECODER_PRECISIONS = ("fp32", "bf16", "bfp16", "int8", "int4")
TEXT_TOPIC = "exceptions"
# the synthesized speech set shipped as package data: 8 sentences written for this project,
# espeak-ng 1.51 (en-us, 150 wpm) -> sox 16 kHz mono FLAC, 89 words (transcripts.json)
SPEECH_SET = Path(__file__).resolve().parent / "asr" / "speech"
Loader = Callable[[Any], Any]        # precision -> an engine (a Decoder Engine or a Transcriber)


def reference_text() -> tuple[str, str]:
    """(text, its name): real English prose that ships with Python itself."""
    import platform
    from pydoc_data.topics import topics
    return topics[TEXT_TOPIC], (f"CPython {platform.python_version()} pydoc_data.topics"
                                f"['{TEXT_TOPIC}'] (the Language Reference)")


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def wer(ref: str, hyp: str) -> tuple[int, int]:
    """(word edits, reference words): Levenshtein distance over normalized words."""
    r, h = _words(ref), _words(hyp)
    row = list(range(len(h) + 1))
    for i, rw in enumerate(r, 1):
        prev, row[0] = row[0], i
        for j, hw in enumerate(h, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (rw != hw))
    return row[-1], len(r)


def teacher_forced(eng, ids: list[int]) -> tuple[torch.Tensor, float]:
    """Logits after each of ids[:-1] fed one token at a time (the decode path), and the modeled
    NPU ms per step the device charged for them."""
    dec = eng.decoder
    dec.reset()
    delta = CounterDelta(get_device())
    logits = torch.stack([dec.forward([t]) for t in ids[:-1]])
    return logits, delta.take()["modeled_us"] / 1e3 / max(1, len(ids) - 1)


def decoder_scores(logits: torch.Tensor, ids: list[int], ref: torch.Tensor) -> dict:
    """Perplexity of ids[1:] under `logits` and the share of positions whose argmax is fp32's."""
    nll = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(ids[1:])).item()
    return {"perplexity": math.exp(nll),
            "agreement_with_fp32": (logits.argmax(-1) == ref.argmax(-1)).float().mean().item()}


def decoder_run(load: Loader, precision, tokens: int) -> tuple[torch.Tensor, list[int], float]:
    """Load at `precision` (a mode or a per-site mapping), teacher-force the reference text's
    first `tokens` tokens: (logits, ids, modeled ms per step)."""
    text, _ = reference_text()
    eng = load(precision)
    try:
        ids = eng.tokenizer.encode(text)[:tokens]
        logits, ms = teacher_forced(eng, ids)
    finally:
        eng.close()
    return logits, ids, ms


def decoder_rows(model: str | Path, precisions=DECODER_PRECISIONS, tokens: int = 128,
                 log: Callable[[str], None] = lambda s: None, *, load: Loader) -> list[dict]:
    """Per precision: perplexity, agreement with fp32's argmax, modeled ms per decode step.
    load(precision) -> an Engine of `model` (engine/llm/generate.load_decoder; passed in so
    this module, which the loader's precision="auto" uses, imports no loader)."""
    _, name = reference_text()
    runs: dict[str, tuple[torch.Tensor, float]] = {}
    ids: list[int] = []
    for prec in dict.fromkeys(("fp32", *precisions)):
        log(f"{prec}: loading")
        logits, ids, ms = decoder_run(load, prec, tokens)
        runs[prec] = (logits, ms)
    return [{"precision": prec, **decoder_scores(runs[prec][0], ids, runs["fp32"][0]),
             "modeled_ms_per_token": runs[prec][1], "tokens": len(ids), "data": name}
            for prec in precisions]


def load_speech_set(folder: Path) -> list[tuple[Path, str]]:
    """(audio file, reference text) from folder/transcripts.json ([{file, text}, ...])."""
    path = Path(folder) / "transcripts.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no transcripts.json; pass --speech DIR with a "
                         "transcripts.json listing {\"file\", \"text\"} per clip")
    return [(Path(folder) / c["file"], c["text"]) for c in json.loads(path.read_text())]


def speech_errors(asr, clips: list[tuple[Path, str]], options) -> dict:
    """Word edits and reference words over the clips (transcribed with `options`, a
    TranscribeOptions with the language set), and the modeled NPU ms per window."""
    edits = words = windows = 0
    ms = 0.0
    for audio, ref in clips:
        r = asr.transcribe(audio, options)
        e, n = wer(ref, r.text)
        edits, words = edits + e, words + n
        ms += r.stats.modeled_total_ms
        windows += max(1, r.stats.windows)
    return {"wer": edits / max(1, words), "word_errors": edits, "words": words,
            "modeled_ms_per_window": ms / max(1, windows)}


def whisper_rows(model: str | Path, speech: Path, precisions=WHISPER_PRECISIONS,
                 log: Callable[[str], None] = lambda s: None, *, load: Loader,
                 options) -> list[dict]:
    """Per precision: WER over the speech set, modeled ms per window. load(precision) -> a
    Transcriber of `model` (engine/asr/transcribe.Transcriber.load); options: its
    TranscribeOptions (language given: greedy, no detection)."""
    clips = load_speech_set(speech)
    rows = []
    for prec in precisions:
        log(f"{prec}: {len(clips)} clips")
        asr = load(prec)
        try:
            rows.append({"precision": prec, **speech_errors(asr, clips, options), "clips": len(clips),
                         "data": str(speech)})
        finally:
            asr.close()
    return rows


def embedder_rows(model: str | Path | None = None) -> list[dict]:
    """The engine's vectors (bf16) vs sentence-transformers fp32 on the text's sentences."""
    from torch_xdna.engine.embed.embedder import EmbedStats, Embedder, default_model_dir
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ModuleNotFoundError("the fp32 reference for embedders is sentence-transformers: "
                                  "pip install sentence-transformers") from None
    text, name = reference_text()
    sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]
    path = Path(model) if model else default_model_dir()
    emb = Embedder.load(path)
    stats = EmbedStats()
    ours = emb.embed(sents, stats)
    ref = torch.from_numpy(SentenceTransformer(str(path), device="cpu").encode(sents))
    cos = torch.nn.functional.cosine_similarity(ours.float(), ref.float(), dim=-1)
    return [{"precision": "bf16", "cosine_min": cos.min().item(), "cosine_mean": cos.mean().item(),
             "modeled_ms_per_sentence": stats.modeled_us / 1e3 / len(sents),
             "sentences": len(sents), "data": name}]
