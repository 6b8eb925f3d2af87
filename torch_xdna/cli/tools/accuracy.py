"""`xdna accuracy MODEL`: accuracy of each precision mode against fp32 on real weights, with the
modeled NPU time of each mode (engine/accuracy.py says what is measured on what)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torch_xdna.cli.args import add_command, positive_int


def register(subparsers) -> None:
    p = add_command(subparsers, "accuracy", help="accuracy per precision vs fp32 (real weights)",
                    description=__doc__)
    p.add_argument("model", nargs="?", default=None,
                   help="a decoder (HF directory, GGUF file), a Whisper directory (HF or "
                        "CTranslate2), an embedding directory, or a packaged checkpoint's name "
                        "(default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--precision", action="append", default=None,
                   help="modes to measure (repeatable; default: every mode the model allows)")
    p.add_argument("--tokens", type=positive_int, default=128,
                   help="decoders: tokens of the reference text teacher-forced (default 128)")
    p.add_argument("--speech", type=Path, default=None,
                   help="Whisper: a folder with transcripts.json and the clips (default: the "
                        "8 espeak-ng clips shipped in torch_xdna/engine/asr/speech)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torch_xdna.engine import accuracy as acc
    from torch_xdna.models.formats.gguf import is_gguf
    from torch_xdna.models.packaged import resolve
    log = lambda s: print(f"xdna accuracy: {s}", file=sys.stderr)  # noqa: E731
    if args.model is None:
        kind, path = "embedding", None
    else:
        from torch_xdna.server.registry import model_kind
        path = resolve(args.model)
        if not path.exists():
            raise ValueError(f"{args.model}: no such file or directory (nor a packaged checkpoint)")
        kind = "chat" if is_gguf(path) else model_kind(path)
    if kind == "chat":
        from torch_xdna.engine.llm.generate import load_decoder
        rows = acc.decoder_rows(path, tuple(args.precision or acc.DECODER_PRECISIONS),
                                args.tokens, log, load=lambda p: load_decoder(
                                    path, p, max_context=args.tokens + 8, quiet=True,
                                    cache_dir=False))
        cols = ("perplexity", "agreement_with_fp32", "modeled_ms_per_token")
    elif kind == "asr":
        from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
        rows = acc.whisper_rows(path, args.speech or acc.SPEECH_SET,
                                tuple(args.precision or acc.WHISPER_PRECISIONS),
                                log, load=lambda p: Transcriber.load(path, p),
                                options=TranscribeOptions(language="en"))
        cols = ("wer", "modeled_ms_per_window")
    elif kind == "embedding":
        rows = acc.embedder_rows(path)
        cols = ("cosine_min", "cosine_mean", "modeled_ms_per_sentence")
    else:
        raise ValueError(f"{args.model}: a {kind} model; accuracy covers decoders, Whisper and "
                         "embedders")
    if args.json:
        print(json.dumps({"model": str(args.model or "all-MiniLM-L6-v2"), "rows": rows,
                          "accuracy": "measured on this host", "time": "modeled"}, indent=2))
        return 0
    print(f"{args.model or 'all-MiniLM-L6-v2'} on {rows[0]['data']} (accuracy measured on this "
          "host vs fp32; NPU time modeled)")
    print("precision  " + "  ".join(f"{c:>22}" for c in cols))
    for r in rows:
        print(f"{r['precision']:<9}  " + "  ".join(f"{r[c]:>22.4f}" for c in cols))
    return 0
