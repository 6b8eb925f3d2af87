"""`xdna estimate whisper-small` (or a Whisper directory): modeled NPU cost of one 30-s window
(encoder Program + decode steps) from the shapes alone. Called by cli/tools/estimate.py first; returns
None when the model is not a Whisper, so the decoder-LLM estimate handles it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def maybe_run(args: argparse.Namespace) -> int | None:
    from torch_xdna.engine.asr.estimate import SHAPES, builtin_spec, estimate_whisper
    model = args.model
    if Path(model).is_dir():
        from torch_xdna.models.hf import read_config
        if read_config(model).get("model_type") != "whisper":
            return None
        from torch_xdna.models.whisper import read_whisper
        spec, name = read_whisper(model).spec, Path(model).name
    elif model.lower() in SHAPES:
        name = model.lower()
        spec = builtin_spec(name)
    else:
        return None
    bad = [p for p in (args.precision or []) if p != "bf16"]
    if bad:
        raise ValueError(f"Whisper runs in bf16 on the NPU; --precision {bad[0]} is not "
                         "supported for it")
    r = estimate_whisper(spec, "bf16")
    try:                               # the CPU peer in the same run (transformers, fp32)
        from torch_xdna.engine.asr.estimate import measure_cpu_window
        r.update(measure_cpu_window(spec, r["tokens_per_window"]))
    except Exception as e:             # noqa: BLE001 - the modeled figure stands without the peer
        r["measured_cpu_ms_per_window"] = None
        r["cpu_peer_error"] = f"{type(e).__name__}: {e}"
    if args.json:
        print(json.dumps({"model": name, "modeled": True, "results": [r]}, indent=2))
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
