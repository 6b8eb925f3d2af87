"""LLM decode engine benchmark.

Modeled (simulator cost model, never a hardware measurement): a Qwen3-0.6B-shaped model (the real
config's shapes, random weights built directly in the engine's format), batch 1, 1k-token
context: decode ms/token, dispatches/token, launches/layer, MB/token, ratio to the DRAM-bandwidth
floor (bytes/token at the cost model's single-pass stream rate, 38.5 GB/s on npu4, cost-v3), prefill tok/s, for bf16 and int4, in the default layout (one
launch per layer) and, for comparison, the other one; the targets (<= 2 launches/layer,
1 dispatch/token, decode <= 1.2x the floor) are checked on every row. The decode figures come from
the device counters of real decode steps (the engine run at position 1024), cross-checked against
the plan-only estimate; prefill tok/s comes from the plans (a 1k-token prefill of a 0.6B model in
the PyTorch reference would take minutes on the host).

Measured (wall clock on this host): engine tok/s (the simulator executes the NPU-numerics
references in PyTorch on the CPU) vs Hugging Face transformers generate on the CPU, same random
Qwen3 model, same prompt, same number of greedy tokens, same process and thread count, both
warmed up; the two run alternately several times and the medians are compared (the host is
shared). Two sizes: tiny (hidden 256, 4 layers; per-op overhead dominates) and mid (hidden 512,
8 layers; weight streaming dominates); --quick measures the tiny one only.

    python benchmarks/bench_llm.py [--quick] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torch_xdna.engine.llm.decoder import DEFAULT_LAYOUT, LAYOUTS, Decoder, PrecisionPolicy
from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.engine.llm.quantize import quantize
from torch_xdna.hw import get_generation
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.models.loader import site_names
from torch_xdna.runtime.sim.cost import stream_bandwidth
from torch_xdna.runtime.sim import SimDevice

CONTEXT = 1024
TARGET_FLOOR_RATIO = 1.2
TARGET_LAUNCHES_PER_LAYER = 2
TARGET_DISPATCHES_PER_TOKEN = 1
LAYOUT_ORDER = (DEFAULT_LAYOUT, *(x for x in LAYOUTS if x != DEFAULT_LAYOUT))


def random_weights(spec, policy: PrecisionPolicy, seed: int = 0) -> dict:
    """Random weights of `spec` drawn directly in the engine's stored format (no HF model, no
    fp32 copy of the model): bf16 values, or int4/int8 codes + bf16 group scales, or bfp16
    blocks of a random matrix. Values only need realistic magnitudes for the cost figures."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (spec.vocab, spec.hidden), "lm_head": (spec.vocab, spec.hidden),
              "qkv": (spec.q_dim + 2 * spec.kv_dim, spec.hidden), "o": (spec.hidden, spec.q_dim),
              "gate_up": (2 * spec.intermediate, spec.hidden),
              "down": (spec.hidden, spec.intermediate), "q_norm": (spec.head_dim,),
              "k_norm": (spec.head_dim,)}
    kinds = {"qkv": "attention", "o": "attention", "gate_up": "mlp", "down": "mlp",
             "embed": "head", "lm_head": "head"}
    out = {}
    for site in site_names(spec):
        part = site.rsplit(".", 1)[-1]
        shape = shapes.get(part, (spec.hidden,))
        if len(shape) == 1:
            out[site] = ((1.0 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16),)
            continue
        n, k = shape
        prec = getattr(policy, kinds[part])
        grp = policy.block_group(spec, kinds[part])
        if prec in ("int4", "int8"):
            q = (torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8) if prec == "int4"
                 else torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8))
            qmax = 7 if prec == "int4" else 127
            scales = torch.full((n, k // grp), k ** -0.5 * 2 / qmax, dtype=torch.bfloat16)
            out[site] = (q, scales)
        else:
            w = torch.randn(shape, generator=g, dtype=torch.bfloat16) * (k ** -0.5)
            out[site] = quantize(w, prec) if prec != "bf16" else (w,)
    return out


def modeled_decode(precision: str, steps: int, layouts=LAYOUT_ORDER) -> list[dict]:
    """One row per layout: `steps` real decode steps of the Qwen3-0.6B-shaped model at position
    CONTEXT on a fresh simulated device; figures from the device counters. The random weights
    are built once and shared by the layouts."""
    _, spec = resolve_spec("qwen3-0.6b")
    policy = PrecisionPolicy.parse(precision)
    t0 = time.perf_counter()
    weights = random_weights(spec, policy)
    build_s = time.perf_counter() - t0
    rows = [_decode_row(spec, policy, precision, weights, steps, layout) for layout in layouts]
    for r in rows:
        r["weights_build_s"] = build_s
    return rows


def _decode_row(spec, policy: PrecisionPolicy, precision: str, weights: dict, steps: int,
                layout: str) -> dict:
    gen = get_generation("npu4")
    dev = SimDevice(gen, 16 << 30)
    dec = Decoder(spec, weights, policy, max_context=CONTEXT + steps + 1, device=dev,
                  layout=layout)
    dec.cache.length = CONTEXT                    # decode at a 1k context (cache content random)
    dec.forward([1])                               # warm: design configured, plans cached
    c0 = dev.counters.snapshot()
    t1 = time.perf_counter()
    for i in range(steps):
        dec.forward([2 + i])
    host_s = (time.perf_counter() - t1) / steps
    c1 = dev.counters.snapshot()
    d = {k: c1[k] - c0[k] for k in ("modeled_us", "dispatches", "launches", "dram_bytes")}
    dec.close()
    OPERANDS.clear()
    est = estimate(spec, precision, CONTEXT, layout=layout)
    ms = d["modeled_us"] / steps / 1e3
    mb = d["dram_bytes"] / steps / 1e6
    floor_ms = mb * 1e6 / stream_bandwidth(gen, gen.columns.value) * 1e3
    row = {
        "model": "qwen3-0.6b (random weights)", "precision": precision, "layout": layout,
        "default_layout": layout == DEFAULT_LAYOUT, "context": CONTEXT,
        "modeled_decode_ms_per_token": ms, "modeled_decode_tok_s": 1e3 / ms,
        "dispatches_per_token": d["dispatches"] / steps,
        "launches_per_layer": (d["launches"] / steps - 2) / spec.layers,
        "mb_per_token": mb, "floor_ms_per_token": floor_ms, "floor_ratio": ms / floor_ms,
        "modeled_prefill_tok_s": est["modeled_prefill_tok_s"],
        "estimate_decode_ms_per_token": est["modeled_decode_ms_per_token"],
        "decode_terms_ms": est["decode_terms_ms"],
        "host_s_per_token": host_s,
    }
    row["targets_met"] = targets_met(row)
    return row


def targets_met(r: dict) -> dict:
    """The decode targets checked on one row (one precision, one layout)."""
    return {"launches": r["launches_per_layer"] <= TARGET_LAUNCHES_PER_LAYER,
            "dispatch": r["dispatches_per_token"] == TARGET_DISPATCHES_PER_TOKEN,
            "floor": r["floor_ratio"] <= TARGET_FLOOR_RATIO}


# name -> (hidden, intermediate, layers, head_dim, new tokens)
MEASURED_SIZES = {"tiny": (256, 768, 4, 32, 32), "mid": (512, 1536, 8, 64, 64)}


def measured_vs_hf(quick: bool, threads: int = 1) -> list[dict]:
    """Engine (sim, bf16 NPU numerics) vs transformers generate on the CPU, same model, both with
    `threads` intra-op threads (1 by default: tiny decode ops gain nothing from a thread pool,
    and on a shared 2-core host a pool makes both sides noisy). One row per model size."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [_measured_vs_hf(size, 3 if quick else 5, AutoModelForCausalLM, Qwen3Config)
                for size in (("tiny",) if quick else tuple(MEASURED_SIZES))]
    finally:
        torch.set_num_threads(prev_threads)


def _measured_vs_hf(size: str, reps: int, AutoModelForCausalLM, Qwen3Config) -> dict:
    hidden, inter, layers, head_dim, n_new = MEASURED_SIZES[size]
    cfg = Qwen3Config(vocab_size=4096, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=head_dim, max_position_embeddings=1024, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    prompt = [int(x) for x in torch.randint(10, 4000, (32,))]
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        eng = load_decoder(Path(tmp), "bf16", max_context=256, quiet=True, device=SimDevice(
            get_generation("npu4"), 8 << 30))
        gcfg = GenerationConfig(max_tokens=n_new, stop_token_ids=())
        eng.complete(prompt, GenerationConfig(max_tokens=4, stop_token_ids=()))      # warm
        ids = torch.tensor([prompt])
        hf_gen = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            model.generate(ids, **{**hf_gen, "max_new_tokens": 4, "min_new_tokens": 4})
        engine_s, hf_s = [], []
        for _ in range(reps):                  # alternate, compare medians: the host is shared
            t0 = time.perf_counter()
            r = eng.complete(prompt, gcfg)
            engine_s.append(time.perf_counter() - t0)
            with torch.no_grad():
                t0 = time.perf_counter()
                out = model.generate(ids, **hf_gen)
                hf_s.append(time.perf_counter() - t0)
        eng.close()
    OPERANDS.clear()
    ratios = sorted(h / e for e, h in zip(engine_s, hf_s))
    engine_s, hf_s = statistics.median(engine_s), statistics.median(hf_s)
    same = out[0, len(prompt):].tolist()[:8] == r.token_ids[:8]
    return {
        "model": f"qwen3 random h{cfg.hidden_size} L{cfg.num_hidden_layers} V{cfg.vocab_size}",
        "size": size, "new_tokens": n_new, "threads": torch.get_num_threads(),
        "median_of": reps,
        "engine_tok_s_measured": n_new / engine_s, "hf_cpu_tok_s_measured": n_new / hf_s,
        "engine_over_hf": hf_s / engine_s,
        "engine_over_hf_per_rep": ratios,
        "engine_decode_tok_s_measured": r.stats.measured_decode_tok_s,
        "engine_ttft_s_measured": r.stats.measured_ttft_s,
        "first_8_greedy_tokens_equal": same,
    }


def run(quick: bool = False, threads: int = 1) -> dict:
    steps = 1 if quick else 3
    modeled = [r for p in ("bf16", "int4") for r in modeled_decode(p, steps)]
    modeled.sort(key=lambda r: LAYOUT_ORDER.index(r["layout"]))      # default layout first
    measured = measured_vs_hf(quick, threads)
    return {
        "default_layout": DEFAULT_LAYOUT, "modeled": modeled, "measured": measured,
        "targets": {"launches_per_layer_max": TARGET_LAUNCHES_PER_LAYER,
                    "dispatches_per_token": TARGET_DISPATCHES_PER_TOKEN,
                    "floor_ratio_max": TARGET_FLOOR_RATIO,
                    "met": {f"{r['precision']}/{r['layout']}": r["targets_met"]
                            for r in modeled}},
        "notes": "modeled = simulator cost model (not hardware); measured = wall clock on this host",
    }


def print_table(res: dict) -> None:
    print(f"Qwen3-0.6B shapes, batch 1, context {CONTEXT} (MODELED by the simulator's cost "
          f"model); default layout '{res['default_layout']}', the other shown for comparison")
    hdr = ("precision", "layout", "decode ms/tok", "tok/s", "disp/tok", "launch/layer", "MB/tok",
           "floor ms", "x floor", "prefill tok/s", "targets")
    rows = [hdr] + [(r["precision"], r["layout"] + (" (default)" if r["default_layout"] else ""),
                     f"{r['modeled_decode_ms_per_token']:.2f}",
                     f"{r['modeled_decode_tok_s']:.1f}", f"{r['dispatches_per_token']:.0f}",
                     f"{r['launches_per_layer']:.0f}", f"{r['mb_per_token']:.1f}",
                     f"{r['floor_ms_per_token']:.2f}", f"{r['floor_ratio']:.2f}",
                     f"{r['modeled_prefill_tok_s']:.0f}", _verdict(r["targets_met"]))
                    for r in res["modeled"]]
    w = [max(len(r[i]) for r in rows) for i in range(len(hdr))]
    for r in rows:
        print("  ".join(c.rjust(x) for c, x in zip(r, w)))
    t = res["targets"]
    print(f"  targets: <= {t['launches_per_layer_max']} launches/layer, "
          f"{t['dispatches_per_token']} dispatch/token, decode <= {t['floor_ratio_max']}x floor")
    for r in res["modeled"]:
        terms = r["decode_terms_ms"]
        print(f"  {r['precision']}/{r['layout']} decode terms (ms): " + ", ".join(
            f"{k} {v:.2f}" for k, v in terms.items() if abs(v) > 1e-3))
    for m in res["measured"]:
        print(f"\nMEASURED on this host ({m['model']}, {m['new_tokens']} greedy tokens, "
              f"{m['threads']} threads, median of {m['median_of']} alternating runs): engine "
              f"{m['engine_tok_s_measured']:.1f} tok/s vs HF transformers CPU "
              f"{m['hf_cpu_tok_s_measured']:.1f} tok/s -> ratio {m['engine_over_hf']:.2f} "
              f"(per run {min(m['engine_over_hf_per_rep']):.2f}.."
              f"{max(m['engine_over_hf_per_rep']):.2f})")


def _verdict(met: dict) -> str:
    missed = [k for k, ok in met.items() if not ok]
    return "met" if not missed else "MISSED: " + ",".join(missed)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the measured part")
    a = ap.parse_args()
    result = run(a.quick, a.threads)
    if not a.json:
        print_table(result)
    print(json.dumps(result, indent=2, default=float))
