"""`xdna generate MODEL_DIR "prompt"`: stream text from a Hugging Face decoder directory
(Qwen3, Llama 3.x, Gemma 3 text) on the (simulated by default) NPU."""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES
from torch_xdna.cli.args import add_command, add_decoder_precision, number, positive_int

def finite_float(text: str) -> float:
    """argparse type: a finite number (nan and inf would reach the sampler as NaN probabilities)."""
    value = number(text, float, "a number")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a finite number")
    return value


def register(subparsers) -> None:
    from torch_xdna.engine.llm.decoder import DEFAULT_LAYOUT, LAYOUTS
    p = add_command(
        subparsers, "generate", help="stream text from a HF decoder directory",
        description="Generate text with the fused decode engine. NPU figures are modeled by the "
                    "simulator unless the xrt backend is in use; host figures are measured.",
        epilog='examples:\n  xdna generate ./Qwen3-0.6B "The capital of France is"\n'
               '  xdna generate ./Qwen3-0.6B "Tell me a joke" --chat --max-tokens 64 '
               '--temperature 0.7 --seed 1\n'
               '  xdna generate ./Llama-3.2-1B "Hi" --precision int4 --stop "\\n" --json')
    p.add_argument("model", metavar="MODEL", help="Hugging Face model directory or llama.cpp "
                                                  ".gguf file")
    p.add_argument("prompt", help="prompt text ('-' reads stdin)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the "
                                                       "model's chat template")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("--image", action="append", default=[], metavar="FILE",
                   help="an image for a vision-language model (Gemma 3), before the prompt's "
                        "text; repeatable; implies --chat")
    p.add_argument("--max-tokens", type=positive_int, default=256)
    p.add_argument("--temperature", type=finite_float, default=0.0,
                   help="0 = greedy (default); >= 0")
    p.add_argument("--top-k", type=int, default=0, help=">= 0; 0 = off (default)")
    p.add_argument("--top-p", type=finite_float, default=1.0, help="in (0, 1]; 1 = off (default)")
    p.add_argument("--repetition-penalty", type=finite_float, default=1.0,
                   help="> 0; 1 = off (default)")
    p.add_argument("--seed", type=int, help="an integer in [-2**63, 2**64 - 1]")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_decoder_precision(p, "bf16, or for a .gguf file its own blocks (Q8_0 -> int8, "
                             "Q4_0 -> int4)")
    p.add_argument("--tokenizer", metavar="DIR", help="take tokenizer.json and the chat template "
                                                      "from DIR (e.g. for a .gguf whose tokenizer "
                                                      "cannot be rebuilt)")
    p.add_argument("--max-context", type=positive_int,
                   help="KV cache capacity in tokens (default: the model's maximum context, "
                        "capped so the cache takes at most half the memory left after the "
                        "weights)")
    p.add_argument("--prefill-chunk", type=positive_int, default=128, metavar="TOKENS",
                   help="prompt tokens per prefill launch (default 128; a prompt's last partial "
                        "chunk runs at the next power of two). `xdna kernels build --model` "
                        "takes the same option so the artifacts match")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default=DEFAULT_KV_DTYPE,
                   help="KV cache storage: bf16, or int8 with a scale per head and token "
                        "(half the bytes per token; default bf16)")
    p.add_argument("--layout", choices=LAYOUTS, default=DEFAULT_LAYOUT,
                   help=f"launches per layer: layer = 1, block = attention + MLP (2) "
                        f"(default {DEFAULT_LAYOUT})")
    p.add_argument("--json", action="store_true", help="print one JSON object (text + stats)")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no stats line")
    p.set_defaults(func=run)


def npu_kind(backend: str) -> str:
    """How the NPU figures were obtained: modeled (sim), emulated (the emulated NPU: host time
    of the emulation, never NPU speed) or measured (a real NPU through XRT)."""
    from torch_xdna.runtime.xrt import emulated_selected
    return "modeled" if backend == "sim" else "emulated" if emulated_selected() else "measured"


def stats_line(stats, backend: str) -> str:
    kind = npu_kind(backend)
    return (f"[{stats.prompt_tokens} prompt + {stats.generated_tokens} generated tokens | host "
            f"(measured): TTFT {stats.measured_ttft_s * 1e3:.0f} ms, "
            f"{stats.measured_decode_tok_s:.1f} tok/s | NPU ({kind}): prefill "
            f"{stats.modeled_prefill_tok_s:.0f} tok/s, decode {stats.modeled_decode_ms_per_token:.2f}"
            f" ms/token, {stats.dispatches_per_token:.0f} dispatch/token, "
            f"{stats.mb_per_token:.1f} MB/token]")


def run(args: argparse.Namespace) -> int:
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    cfg = GenerationConfig(max_tokens=args.max_tokens, temperature=args.temperature,
                           top_k=args.top_k, top_p=args.top_p,
                           repetition_penalty=args.repetition_penalty, seed=args.seed,
                           stop=tuple(args.stop))
    cfg.sampling().validate()            # refuse bad sampling options before loading weights
    images = []
    if args.image:                       # read and checked before loading weights
        from torch_xdna.models.vision import open_image
        from torch_xdna.models.vlm import is_vlm_dir
        if not is_vlm_dir(args.model):
            raise ValueError(f"{args.model}: --image needs a vision-language model directory "
                             f"(Gemma 3 with a vision_config); this one takes text only")
        from torch_xdna.engine.llm.vlm import load_vlm as load_decoder  # noqa: F811
        images = [open_image(Path(f).read_bytes(), f) for f in args.image]
    engine = load_decoder(args.model, args.precision, max_context=args.max_context,
                          prefill_chunk=args.prefill_chunk,
                          quiet=args.quiet or args.json, layout=args.layout,
                          tokenizer_dir=args.tokenizer, kv_dtype=args.kv_dtype,
                          budget=args.precision_budget)
    if args.json and not args.quiet and engine.files.gguf is not None:
        for note in engine.files.gguf.notes:          # the GGUF load log, kept off stdout
            print(f"xdna: {engine.files.path.name}: {note}", file=sys.stderr)
    if args.chat or images:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        msgs.append({"role": "user", "content": prompt if not images else
                     [{"type": "image", "image": im} for im in images]
                     + [{"type": "text", "text": prompt}]})
        prompt = msgs
    backend = engine.decoder.dev.backend
    try:
        if args.json:
            r = engine.complete(prompt, cfg)
            s = r.stats
            kind = {"measured": "measured_npu"}.get(npu_kind(backend), npu_kind(backend))
            print(json.dumps({
                "model": engine.model_name, "precision": engine.decoder.policy.ident(),
                "backend": backend, "text": r.text, "token_ids": list(r.token_ids),
                "finish_reason": r.finish_reason,
                "usage": r.usage,
                "measured": {"ttft_s": s.measured_ttft_s, "decode_tok_s": s.measured_decode_tok_s,
                             "total_s": s.measured_total_s, "where": "this host, wall clock"},
                kind: {"prefill_tok_s": s.modeled_prefill_tok_s,
                       "decode_ms_per_token": s.modeled_decode_ms_per_token,
                       "decode_tok_s": s.modeled_decode_tok_s,
                       "dispatches_per_token": s.dispatches_per_token,
                       "launches_per_token": s.launches_per_token,
                       "mb_per_token": s.mb_per_token, "where": f"NPU ({backend} backend)"}}))
            return 0
        last = None
        for chunk in engine.generate(prompt, cfg):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            last = chunk
        sys.stdout.write("\n")
        if not args.quiet and last is not None and last.stats is not None:
            print(stats_line(last.stats, backend), file=sys.stderr)
        return 0
    finally:
        engine.close()
