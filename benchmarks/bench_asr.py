"""Whisper ASR: modeled NPU ms per 30-s window (tiny/base/small shapes) and measured host time
next to transformers on the CPU, in the same run.

  * modeled: engine/asr/estimate.py (the simulator's cost model on the engine's own plans; what
    the sim charges) for one window: the encoder Program, the prompt and TOKENS decode steps;
  * measured on this host: one 30-s window transcribed by the engine on the simulator (bf16
    NPU numerics executed on the CPU) and by transformers' WhisperForConditionalGeneration.generate
    (fp32, eager, CPU), the same random-weight checkpoint of the real shapes (vocabulary 51865),
    the same audio, the same token budget; the two alternate, median of REPS with min/max.
The simulator's host time is not an NPU figure: it runs the NPU's numerics on the CPU.
Run: python benchmarks/bench_asr.py [--quick] [--shapes tiny,base,small] [--reps 5] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

TOKENS = 32          # decode steps per measured window (random weights rarely stop by themselves)


def make_dir(path: Path, shape: str) -> Path:
    """A random-weight Whisper of the real shape with the real special-token layout."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    from torch_xdna.engine.asr.estimate import SHAPES
    d, layers, heads = SHAPES[f"whisper-{shape}"]
    cfg = WhisperConfig(vocab_size=51865, d_model=d, encoder_layers=layers,
                        decoder_layers=layers, encoder_attention_heads=heads,
                        decoder_attention_heads=heads, encoder_ffn_dim=4 * d,
                        decoder_ffn_dim=4 * d, decoder_start_token_id=50258, eos_token_id=50257,
                        pad_token_id=50257, bos_token_id=50257, suppress_tokens=None,
                        begin_suppress_tokens=None, init_std=0.2)
    torch.manual_seed(0)
    WhisperForConditionalGeneration(cfg).save_pretrained(path)
    (path / "generation_config.json").write_text(json.dumps({
        "decoder_start_token_id": 50258, "eos_token_id": 50257, "pad_token_id": 50257,
        "bos_token_id": 50257, "max_length": 448, "is_multilingual": True,
        "lang_to_id": {"<|en|>": 50259, "<|de|>": 50261},
        "task_to_id": {"transcribe": 50359, "translate": 50358},
        "no_timestamps_token_id": 50363, "suppress_tokens": [50360, 50362],
        "begin_suppress_tokens": [220, 50257]}))
    return path


def audio_30s():
    import numpy as np
    t = np.arange(30 * 16000) / 16000
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 0.5 * t)
            + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def bench_shape(shape: str, reps: int, workdir: Path) -> dict:
    import torch
    from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration
    from torch_xdna.engine.asr.estimate import builtin_spec, estimate_whisper
    from torch_xdna.engine.asr.transcribe import Transcriber, TranscribeOptions
    out = {"shape": f"whisper-{shape}", "modeled": estimate_whisper(builtin_spec(f"whisper-{shape}"),
                                                                   tokens=TOKENS)}
    d = make_dir(workdir / shape, shape)
    audio = audio_30s()
    hf = WhisperForConditionalGeneration.from_pretrained(d, attn_implementation="eager").eval()
    fe = WhisperFeatureExtractor()
    asr = Transcriber.load(d, "bf16")
    opts = TranscribeOptions(language="en", max_new_tokens=TOKENS)
    ours, theirs, tok_ours, tok_hf, modeled = [], [], 0, 0, 0.0
    try:
        asr.transcribe(audio, opts)                        # warm: plans, operand copies
        for _ in range(reps):                              # alternate the two, same inputs
            t0 = time.perf_counter()
            r = asr.transcribe(audio, opts)
            ours.append(time.perf_counter() - t0)
            tok_ours, modeled = r.stats.tokens, r.stats.modeled_total_ms
            t0 = time.perf_counter()
            feats = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
            with torch.no_grad():
                seq = hf.generate(feats, language="en", max_new_tokens=TOKENS,
                                  force_unique_generate_call=True)
            theirs.append(time.perf_counter() - t0)
            tok_hf = seq.shape[-1] - 4
    finally:
        asr.close()
    out["measured_host_s_engine_sim"] = _stats(ours)
    out["measured_host_s_transformers_cpu"] = _stats(theirs)
    out["tokens"] = {"engine": tok_ours, "transformers": tok_hf}
    out["sim_modeled_ms_this_run"] = modeled
    out["torch_threads"] = torch.get_num_threads()
    return out


def run(quick: bool = False, shapes: tuple[str, ...] = ("tiny", "base", "small"),
        reps: int = 5) -> dict:
    from torch_xdna.engine.asr.estimate import builtin_spec, estimate_whisper
    if quick:
        shapes, reps = ("tiny",), 3
    result = {"tokens_per_window": TOKENS, "note": "modeled = simulator cost model; measured = "
              "wall clock on this host", "modeled_100_tokens": {
                  s: estimate_whisper(builtin_spec(f"whisper-{s}"))["modeled_ms_per_window"]
                  for s in ("tiny", "base", "small")}, "shapes": []}
    with tempfile.TemporaryDirectory() as tmp:
        for s in shapes:
            result["shapes"].append(bench_shape(s, reps, Path(tmp)))
            print(json.dumps(result["shapes"][-1], default=str), file=sys.stderr, flush=True)
    return result


def print_table(r: dict) -> None:
    print(f"{'shape':15} {'modeled NPU ms/window':>22} {'engine sim host s':>18} "
          f"{'transformers CPU s':>19}  ({r['tokens_per_window']} tokens)")
    for s in r["shapes"]:
        e, h = s["measured_host_s_engine_sim"], s["measured_host_s_transformers_cpu"]
        print(f"{s['shape']:15} {s['modeled']['modeled_ms_per_window']:22.1f} "
              f"{e['median']:8.2f} [{e['min']:.2f}-{e['max']:.2f}] "
              f"{h['median']:8.2f} [{h['min']:.2f}-{h['max']:.2f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shape, 3 repetitions")
    ap.add_argument("--shapes", default="tiny,base,small")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads for both sides "
                    "(default: torch's own choice)")
    args = ap.parse_args()
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    r = run(args.quick, tuple(s for s in args.shapes.split(",") if s), args.reps)
    print(json.dumps(r, indent=2, default=str))
    print_table(r)


if __name__ == "__main__":
    main()
