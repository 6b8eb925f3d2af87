"""`xdna transcribe FILE --model DIR`: speech to text with a Whisper directory on the NPU
(simulated by default). Text on stdout (or JSON / SRT / WebVTT); the cost summary on stderr."""
from __future__ import annotations

import argparse
import os
import sys

from torch_xdna.cli.args import CliError, add_budget_argument, add_command
from torch_xdna.cli.output import npu_timing
from torch_xdna.runtime import settings

MODEL_ENV = "TORCH_XDNA_WHISPER_MODEL"


def register(subparsers) -> None:
    p = add_command(
        subparsers, "transcribe",
        help="transcribe an audio file with a Whisper or Parakeet directory",
        description="Transcribe (or translate to English) speech with a Hugging Face Whisper "
                    "directory, or transcribe with a Parakeet CTC / TDT one (each model's own "
                    "decoding; long audio in overlapping 30-s windows). WAV/FLAC/OGG via "
                    "soundfile, MP3 and other formats via PyAV. NPU "
                    "figures are modeled by the simulator unless the xrt backend is in use; "
                    "host figures are measured.",
        epilog="examples:\n  xdna transcribe meeting.wav --model ./whisper-tiny\n"
               "  xdna transcribe talk.mp3 --model ./whisper-small --srt > talk.srt\n"
               "  xdna transcribe interview.flac --model ./whisper-base --language de "
               "--task translate --json")
    p.add_argument("file", metavar="FILE", help="audio file (WAV, FLAC, OGG, MP3, M4A...)")
    p.add_argument("--model", metavar="DIR",
                   help=f"Whisper or Parakeet directory (default: ${MODEL_ENV})")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_const", const="verbose_json", dest="format",
                     help="print verbose JSON (text, language, segments)")
    fmt.add_argument("--srt", action="store_const", const="srt", dest="format",
                     help="print SubRip subtitles (timestamps on)")
    fmt.add_argument("--vtt", action="store_const", const="vtt", dest="format",
                     help="print WebVTT subtitles (timestamps on)")
    p.add_argument("--language", help="spoken language, code or name (default: detect)")
    p.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    p.add_argument("--timestamps", action="store_true",
                   help="predict segment timestamps (implied by --srt/--vtt)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, help="sampling seed (with --temperature > 0)")
    p.add_argument("--prompt", help="text that precedes the audio (names, spelling, style)")
    p.add_argument("--precision", choices=("bf16", "int8", "fp32", "auto"), default="bf16",
                   help="bf16 (the NPU's numerics), int8 (weight-only int8 matrices), fp32 "
                        "(verification mode) or auto (per encoder/decoder the cheapest modeled "
                        "precision within --precision-budget on the shipped speech set, "
                        "measured once, saved beside the model)")
    add_budget_argument(p)
    p.add_argument("--max-new-tokens", type=int, dest="max_new_tokens",
                   help="token budget per 30-s window")
    p.set_defaults(func=run, format="text")


def run(args: argparse.Namespace) -> int:
    from torch_xdna.engine.asr.audio import load_audio
    from torch_xdna.engine.asr.subtitles import render
    from torch_xdna.engine.asr.load import load_transcriber
    from torch_xdna.engine.asr.transcribe import TranscribeOptions
    model = args.model or settings.get(MODEL_ENV)
    if not model:
        raise CliError("no speech model: pass --model DIR (a Hugging Face Whisper or Parakeet "
                       f"directory) or set {MODEL_ENV}")
    if not os.path.isfile(args.file):
        raise CliError(f"{args.file}: no such audio file")
    audio = load_audio(args.file)                # refuse an undecodable file before loading
    opts = TranscribeOptions(language=args.language, task=args.task,
                             temperature=args.temperature, seed=args.seed,
                             timestamps=args.timestamps or args.format in ("srt", "vtt",
                                                                           "verbose_json"),
                             prompt=args.prompt, max_new_tokens=args.max_new_tokens)
    asr = load_transcriber(model, args.precision, budget=args.precision_budget)
    try:
        r = asr.transcribe(audio, opts, name=args.file)
    finally:
        asr.close()
    sys.stdout.write(render(r, args.format))
    if args.format == "verbose_json":
        sys.stdout.write("\n")
    s = r.stats
    timing = npu_timing(asr.model.dev)
    print(f"xdna transcribe: {r.duration:.1f} s of audio, {s.windows} window(s), {s.tokens} "
          f"tokens, language {r.language or '-'}; NPU {s.modeled_encoder_ms_per_window:.1f} ms "
          f"per window encoder + {s.modeled_decoder_ms_per_token:.2f} ms per token ({timing}); "
          f"host {s.measured_total_s:.2f} s (measured)", file=sys.stderr)
    return 0
