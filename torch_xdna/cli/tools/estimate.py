"""`xdna estimate MODEL`: modeled NPU cost of a decoder from its config alone (no weights):
decode ms/token, dispatches/token, MB/token, ratio to the DRAM floor, prefill tok/s, at one or
several contexts (--context 1k,4k,32k,128k: one row per precision and context)."""
from __future__ import annotations

import argparse
import json

from torch_xdna.cli.args import add_command


def context_list(text: str) -> list[int]:
    """argparse type: '1k,4k,32768' -> token counts (engine.estimate.parse_contexts)."""
    from torch_xdna.engine.llm.estimate import parse_contexts
    try:
        return parse_contexts(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(subparsers) -> None:
    from torch_xdna.engine.llm.decoder import DEFAULT_LAYOUT, LAYOUTS
    from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES
    from torch_xdna.kernels.blocks.llm import PRECISIONS
    from torch_xdna.models.families import BUILTIN_CONFIGS
    p = add_command(
        subparsers, "estimate", help="modeled NPU cost of an LLM (config only)",
        description="Modeled (simulator cost model) decode and prefill cost of a decoder LLM, from "
                    "config.json or a built-in shape; no weights are read.",
        epilog="built-in shapes: " + ", ".join(BUILTIN_CONFIGS) + "\nexamples:\n"
               "  xdna estimate qwen3-0.6b\n  xdna estimate ./Llama-3.2-1B --precision int4 "
               "--context 2048 --json\n"
               "  xdna estimate llama-3.2-1b --precision int4 --context 1k,2k,4k,8k,16k,32k,128k")
    p.add_argument("model", metavar="MODEL_DIR_OR_SHAPE")
    p.add_argument("--precision", action="append",
                   choices=[p for p in PRECISIONS if p != "fp32"],   # fp32: verification only
                   help="weight precision (repeatable; default bf16 and int4)")
    p.add_argument("--context", type=context_list, default=[1024],
                   help="tokens already in the KV cache; several comma-separated, k = 1024 "
                        "(e.g. 1k,2k,4k,8k,16k,32k,128k)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default=DEFAULT_KV_DTYPE,
                   help="KV cache storage: bf16, or int8 with per-token scales (default bf16)")
    p.add_argument("--layout", choices=LAYOUTS, default=DEFAULT_LAYOUT,
                   help=f"launches per layer: layer = 1, block = attention + MLP (2) "
                        f"(default {DEFAULT_LAYOUT})")
    p.add_argument("--image-size", type=context_list, default=None,
                   help="vision-language directories (Gemma 3): tower resolutions to model the "
                        "time to first token at, comma-separated (default: the config's)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


COLUMNS = (("precision", "precision", "{}"), ("context", "context", "{}"),
           ("decode ms/tok", "modeled_decode_ms_per_token", "{:.2f}"),
           ("tok/s", "modeled_decode_tok_s", "{:.1f}"), ("disp/tok", "dispatches_per_token", "{}"),
           ("runs/tok", "kernel_runs_per_token", "{}"), ("cfg/tok", "configure_points_per_token", "{}"),
           ("launch/layer", "launches_per_layer", "{:.0f}"), ("MB/tok", "mb_per_token", "{:.1f}"),
           ("floor ms", "floor_ms_per_token", "{:.2f}"), ("x floor", "floor_ratio", "{:.2f}"),
           ("prefill tok/s", "modeled_prefill_tok_s", "{:.0f}"))


def table(rows: list[dict]) -> str:
    cells = [[h for h, _, _ in COLUMNS]] + [[f.format(r[k]) for _, k, f in COLUMNS] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def run_vision(args: argparse.Namespace) -> int:
    """Image / super-resolution directories (engine/vision/estimate.py)."""
    from torch_xdna.engine.vision.estimate import describe, estimate_vision
    r = estimate_vision(args.model)
    print(json.dumps({"modeled": True, **r}, indent=2) if args.json else describe(r))
    return 0


def run(args: argparse.Namespace) -> int:
    from torch_xdna.cli.tools.estimate_asr import maybe_run
    done = maybe_run(args)                   # Whisper shapes / directories
    if done is not None:
        return done
    from torch_xdna.engine.embed.estimate import describe, estimate_encoder
    enc = estimate_encoder(args.model, args.context if args.context != [1024] else [128, 512])
    if enc is not None:                      # text / protein encoders (engine/embed/estimate.py)
        print(json.dumps({"modeled": True, **enc}, indent=2) if args.json else describe(enc))
        return 0
    from torch_xdna.models.vlm import is_vlm_dir
    if is_vlm_dir(args.model):               # image prompts: tower + prefill = modeled TTFT
        from torch_xdna.engine.vision.vlm_estimate import describe as vlm_describe, estimate_vlm
        r = estimate_vlm(args.model, args.image_size, tuple(args.precision or ["bf16", "int4"]))
        print(json.dumps({"modeled": True, **r}, indent=2) if args.json else vlm_describe(r))
        return 0
    from torch_xdna.engine.llm.estimate import estimate, resolve_spec
    from torch_xdna.engine.vision.estimate import is_vision_dir
    if is_vision_dir(args.model):
        return run_vision(args)
    contexts = args.context
    name, spec = resolve_spec(args.model)
    rows = [estimate(spec, p, c, layout=args.layout, kv_dtype=args.kv_dtype)
            for p in (args.precision or ["bf16", "int4"]) for c in contexts]
    if args.json:
        print(json.dumps({"model": name, "modeled": True, "results": rows}, indent=2))
        return 0
    print(f"{name}: {spec.family}, {spec.params() / 1e6:.0f}M params, {spec.layers} layers, "
          f"max context {spec.max_positions}, KV {args.kv_dtype}, layout {args.layout}, "
          f"{rows[0]['generation']} (modeled by the simulator's cost model; floor = bytes/token "
          f"at {rows[0]['dram_bps'] / 1e9:.1f} GB/s; prefill tok/s = a whole prompt of that "
          f"many tokens)")
    print(table(rows))
    r = rows[0]
    print(f"memory: {r['generation']} DRAM peak {r['dram_peak_bps'] / 1e9:.1f} GB/s; the NPU's "
          f"modeled single-pass stream {r['dram_bps'] / 1e9:.1f} GB/s is "
          f"{r['dram_bps'] / r['dram_peak_bps']:.0%} of it (at the peak, {r['precision']}@"
          f"{r['context']} would need {r['dram_peak_ms_per_token']:.2f} ms/token)")
    if spec.experts:
        print(f"mixture of experts: {spec.experts} experts, {spec.experts_per_token} per token, "
              f"{spec.params(active=True) / 1e6:.0f}M active params; MB/tok counts the router and "
              f"the chosen experts only: " + ", ".join(
                  f"{r['precision']}@{r['context']} experts {r['expert_mb_per_token']:.1f} MB"
                  for r in rows))
    beyond = sorted({r["context"] for r in rows if r["beyond_model_max"]})
    if beyond:
        print(f"note: context {', '.join(map(str, beyond))} exceeds the model's maximum "
              f"({spec.max_positions} positions): modeled for the bytes only; the engine refuses "
              f"it unless the config extends the context (rope_scaling, e.g. YaRN)")
    return 0
