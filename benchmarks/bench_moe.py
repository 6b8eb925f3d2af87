"""Mixture of experts: modeled NPU tok/s against dense models of the same active and the same
total size, with the measured host time per token beside it.

Modeled (the simulator's cost model on the engine's own plans, engine/llm/estimate.py; never a
hardware measurement), npu4, int4 weights, bf16 KV: Qwen3-30B-A3B's config shapes (128 experts,
8 per token, 3.3B of 30.5B parameters active) against
  dense-active: the same model with one dense MLP as wide as the 8 chosen experts together
                (intermediate 8 x 768 = 6144): what a token computes and streams;
  dense-total:  one dense MLP as wide as all 128 experts (intermediate 98304): what the
                resident weights would cost if every byte streamed.
A MoE decode step streams the router plus its top-k experts, so it should model close to
dense-active and far from dense-total; prefill chunks (128 rows) hit most experts, so MoE
prefill sits between the two.

Measured on this host (wall clock of the simulator running the NPU-numerics references on the
CPU; not an NPU figure): three tiny random-weight models of the same proportions (16 experts, 2
per token, against dense MLPs of the active and the total width), bf16, decoding alternately in
one process, median of the rounds.

    python benchmarks/bench_moe.py [--quick] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # this checkout's torch_xdna, not another installed one
CONTEXTS = (1024, 4096, 32768)


def shapes() -> dict[str, dict]:
    """The MoE config and its two dense peers (config dicts)."""
    from torch_xdna.models.families import BUILTIN_CONFIGS
    moe = dict(BUILTIN_CONFIGS["qwen3-30b-a3b"])
    dense = {k: v for k, v in moe.items() if k not in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
        "decoder_sparse_step", "mlp_only_layers")}
    dense["model_type"] = "qwen3"
    k, e, f = moe["num_experts_per_tok"], moe["num_experts"], moe["moe_intermediate_size"]
    return {"qwen3-30b-a3b (MoE)": moe,
            "dense-active": {**dense, "intermediate_size": k * f},
            "dense-total": {**dense, "intermediate_size": e * f}}


def modeled(contexts=CONTEXTS) -> list[dict]:
    from torch_xdna.engine.llm.decoder import DEFAULT_CHUNK, PrecisionPolicy, plan_chunk
    from torch_xdna.engine.llm.estimate import default_generation, estimate
    from torch_xdna.models.families import spec_from_config
    rows, gen = [], default_generation()
    for name, cfg in shapes().items():
        spec = spec_from_config(cfg)
        for ctx in contexts:
            # the chunk the engine would take (dense-total's 98304-wide MLP stages fewer rows)
            chunk = plan_chunk(spec, PrecisionPolicy.parse("int4"), ctx + 1, DEFAULT_CHUNK, gen)
            r = estimate(spec, "int4", ctx, prefill_chunk=chunk, gen=gen)
            rows.append({"model": name, "context": ctx, "prefill_chunk": chunk,
                         "params_b": spec.params() / 1e9,
                         "active_b": spec.params(active=True) / 1e9,
                         "decode_tok_s": r["modeled_decode_tok_s"],
                         "mb_per_token": r["mb_per_token"],
                         "expert_mb_per_token": r["expert_mb_per_token"],
                         "prefill_tok_s": r["modeled_prefill_tok_s"]})
    return rows


def _tiny_models(root: Path) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from llm_fixtures import build_model
    e, k, f = 16, 2, 64
    common = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, head_dim=64,
                  num_key_value_heads=2, mlp_only_layers=[])
    out = {}
    for name, family, over in (
            ("qwen3-moe tiny (MoE)", "qwen3_moe", dict(num_experts=e, num_experts_per_tok=k,
                                                        moe_intermediate_size=f)),
            ("dense-active", "qwen3", dict(intermediate_size=k * f)),
            ("dense-total", "qwen3", dict(intermediate_size=e * f))):
        path = root / name.split()[0]
        over = {**common, **over}
        if family == "qwen3":
            over.pop("mlp_only_layers")
            over["layer_types"] = ["full_attention"] * common["num_hidden_layers"]
        build_model(family, path, **over)
        out[name] = path
    return out


def measured(rounds: int = 5, tokens: int = 16) -> list[dict]:
    """Host wall clock per decoded token (median of alternating rounds), measured on this host."""
    import torch
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        engines = {n: load_decoder(p, "bf16", max_context=128, quiet=True, cache_dir=False,
                                   prefix_cache=0) for n, p in _tiny_models(Path(tmp)).items()}
        cfg = GenerationConfig(max_tokens=tokens, stop_token_ids=())
        prompt = list(range(5, 13))
        times: dict[str, list[float]] = {n: [] for n in engines}
        for eng in engines.values():
            eng.complete(prompt, cfg)                      # warm up
        for _ in range(rounds):
            for n, eng in engines.items():
                r = eng.complete(prompt, cfg)
                times[n].append(1e3 / r.stats.measured_decode_tok_s)
        rows = [{"model": n, "measured_host_ms_per_token": statistics.median(t),
                 "params_m": eng.spec.params() / 1e6,
                 "active_m": eng.spec.params(active=True) / 1e6,
                 "modeled_decode_ms_per_token": eng.complete(prompt, cfg).stats.modeled_decode_ms_per_token}
                for (n, t), eng in zip(times.items(), engines.values())]
        for eng in engines.values():
            eng.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1K context only, 3 host rounds")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    mod = modeled((1024,) if a.quick else CONTEXTS)
    host = measured(3 if a.quick else 5)
    if a.json:
        print(json.dumps({"modeled": mod, "measured_host": host}, indent=2))
        return 0
    print("modeled (cost model), npu4, int4 weights, bf16 KV:")
    print(f"{'model':22} {'ctx':>6} {'params B':>8} {'active B':>8} {'decode tok/s':>12} "
          f"{'MB/tok':>8} {'expert MB':>9} {'prefill tok/s':>13} {'chunk':>5}")
    for r in mod:
        print(f"{r['model']:22} {r['context']:>6} {r['params_b']:>8.2f} {r['active_b']:>8.2f} "
              f"{r['decode_tok_s']:>12.1f} {r['mb_per_token']:>8.0f} "
              f"{r['expert_mb_per_token']:>9.0f} {r['prefill_tok_s']:>13.0f} "
              f"{r['prefill_chunk']:>5}")
    print("\nmeasured on this host (simulator wall clock, bf16, tiny random-weight models, 1 thread):")
    base = host[1]["measured_host_ms_per_token"]
    for r in host:
        print(f"{r['model']:22} params {r['params_m']:6.2f}M active {r['active_m']:6.2f}M  "
              f"host {r['measured_host_ms_per_token']:7.2f} ms/token "
              f"({r['measured_host_ms_per_token'] / base:.2f}x dense-active)  modeled NPU "
              f"{r['modeled_decode_ms_per_token']:.3f} ms/token")
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
