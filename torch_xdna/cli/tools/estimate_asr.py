"""`xdna estimate whisper-small` / `parakeet-tdt-0.6b` (or a Whisper / Parakeet directory): modeled
NPU cost of one 30-s window (encoder Program + decode steps) from the shapes alone, beside the CPU
peer measured in the same run. Called by cli/tools/estimate.py first; returns None when the model
is neither, so the decoder-LLM estimate handles it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def maybe_run(args: argparse.Namespace) -> int | None:
    from torch_xdna.engine.asr.estimate import SHAPES, builtin_spec, estimate_whisper
    from torch_xdna.engine.asr.parakeet_estimate import ALIASES, SHAPES as PARAKEET
    from torch_xdna.models.speech.parakeet import is_parakeet_dir
    model = args.model
    if model.lower() in PARAKEET or model.lower() in ALIASES or is_parakeet_dir(model):
        return run_parakeet(args)
    if Path(model).is_dir():
        from torch_xdna.models.hf import read_config
        if read_config(model).get("model_type") != "whisper":
            return None
        from torch_xdna.models.speech.whisper import read_whisper
        spec, name = read_whisper(model).spec, Path(model).name
    elif model.lower() in SHAPES:
        name = model.lower()
        spec = builtin_spec(name)
    else:
        return None
    only_bf16(args, "Whisper")
    r = estimate_whisper(spec, "bf16")
    from torch_xdna.engine.asr.estimate import measure_cpu_window
    if with_cpu_peer(args, name, r, lambda: measure_cpu_window(spec, r["tokens_per_window"])):
        return 0
    print(f"{name}: Whisper, {r['params_m']:.0f}M params, d_model {spec.d_model}, "
          f"{spec.encoder_layers}+{spec.decoder_layers} layers, {r['generation']} (modeled by "
          f"the simulator's cost model)")
    print(f"  encoder            {r['modeled_encoder_ms_per_window']:8.1f} ms per 30-s window "
          f"(1 Program)")
    print(f"  decoder            {r['modeled_decoder_ms_per_token']:8.2f} ms per token "
          f"({r['decoder_mb_per_token']:.0f} MB/token)")
    print(f"  30-s window        {r['modeled_ms_per_window']:8.1f} ms at "
          f"{r['tokens_per_window']} tokens = {r['modeled_realtime_factor']:.0f}x real time")
    if r.get("measured_cpu_ms_per_window") is not None:
        print(f"  CPU peer           {r['measured_cpu_ms_per_window']:8.1f} ms per window "
              f"(transformers fp32, {r['cpu_threads']} threads, measured on this host: encoder "
              f"{r['measured_cpu_encoder_ms']:.1f} ms + {r['measured_cpu_ms_per_token']:.2f} "
              f"ms/token)")
    else:
        print(f"  CPU peer           not measured ({r['cpu_peer_error']}; the peer is "
              f"transformers: pip install transformers)")
    return 0


def only_bf16(args: argparse.Namespace, family: str) -> None:
    bad = [p for p in (args.precision or []) if p != "bf16"]
    if bad:
        raise ValueError(f"{family} runs in bf16 on the NPU; --precision {bad[0]} is not "
                         "supported for it")


def with_cpu_peer(args: argparse.Namespace, name: str, r: dict, measure) -> bool:
    """Add the CPU peer measured in this run (transformers, fp32) to `r`; with --json print the
    result and return True (done)."""
    try:
        r.update(measure())
    except Exception as e:             # noqa: BLE001 - the modeled figure stands without the peer
        r["measured_cpu_ms_per_window"] = None
        r["cpu_peer_error"] = f"{type(e).__name__}: {e}"
    if args.json:
        print(json.dumps({"model": name, "modeled": True, "results": [r]}, indent=2))
    return bool(args.json)


def run_parakeet(args: argparse.Namespace) -> int:
    """Parakeet: the encoder Program of a 30-s window and, for TDT, the decoding steps."""
    from torch_xdna.engine.asr.parakeet_estimate import (builtin_spec, estimate_parakeet,
                                                         measure_cpu_window)
    from torch_xdna.models.speech.parakeet import is_parakeet_dir, read_parakeet
    if is_parakeet_dir(args.model):
        spec, name = read_parakeet(args.model).spec, Path(args.model).name
    else:
        spec = builtin_spec(args.model.lower())
        name = spec.name
    only_bf16(args, "Parakeet")
    r = estimate_parakeet(spec, "bf16")
    if with_cpu_peer(args, name, r, lambda: measure_cpu_window(
            spec, r["window_s"], r.get("tokens_per_window", 0), r.get("blank_steps"))):
        return 0
    print(f"{name}: Parakeet ({spec.head.upper()}), {r['params_m']:.0f}M params, hidden "
          f"{spec.hidden}, {spec.layers} layers, {spec.n_mels} mels, {r['generation']} (modeled "
          f"by the simulator's cost model)")
    print(f"  encoder            {r['modeled_encoder_ms_per_window']:8.1f} ms per 30-s window "
          f"({r['encoder_frames']} frames, 1 Program; position keys "
          f"{r['modeled_relpos_ms_once_per_length']:.1f} ms once per window length)")
    if spec.head == "tdt":
        print(f"  TDT decoding       {r['modeled_decoder_ms_per_window']:8.1f} ms per window "
              f"({r['tokens_per_window']} token steps x {r['modeled_step_ms']:.2f} ms + "
              f"{r['blank_steps']} blank steps x {r['modeled_blank_step_ms']:.2f} ms)")
    print(f"  30-s window        {r['modeled_ms_per_window']:8.1f} ms = "
          f"{r['modeled_realtime_factor']:.0f}x real time")
    if r.get("measured_cpu_ms_per_window") is not None:
        print(f"  CPU peer           {r['measured_cpu_ms_per_window']:8.1f} ms per window "
              f"(transformers fp32, {r['cpu_threads']} threads, measured on this host: encoder "
              f"{r['measured_cpu_encoder_ms']:.1f} ms + decoding "
              f"{r['measured_cpu_decoder_ms']:.1f} ms)")
    else:
        print(f"  CPU peer           not measured ({r['cpu_peer_error']})")
    return 0
