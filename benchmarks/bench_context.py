"""Modeled decode and prefill speed by context length (1K-128K), next to FastFlowLM's figures.

Modeled (the simulator's cost model applied to the engine's own plans, engine/llm/estimate.py; never
a hardware measurement): Qwen3-0.6B, Llama-3.2-1B and Gemma-3-1B shapes, int4 and bf16 weights,
bf16 and int8 KV cache, batch 1: decode tok/s at each context (the cache already holds that
many tokens), prefill tok/s of a whole prompt of that length (chunked as the engine chunks it),
MB/token and the ratio to the DRAM floor (bytes/token at the measured NPU read rate). A context
beyond the model's maximum is still modeled (bytes only) and flagged: the engine refuses it
unless the config extends the context (Qwen3 YaRN rope_scaling: 128K).

Published (FastFlowLM, closed source, on a Ryzen AI 7 350 / Krackan XDNA2 with int4 q4nx-like
weights): Llama-3.2-1B decode by context from docs.fastflowlm.com/benchmarks/llama3_results.html
(older page, version not stated) and the 1K decode/prefill figures of Qwen3-0.6B and Llama-3.2-1B
from benchmarks/backtest/figures.py (shared/docs/xdna2-facts.md). No by-context Qwen3-0.6B table
was found. Different hardware (Krackan vs the npu4 Strix point modeled here) and software: the
comparison is of shape (how speed falls with context), not a claim of equal speed.

    python benchmarks/bench_context.py [--quick] [--json]
"""
from __future__ import annotations

import argparse
import json
import time

from torch_xdna.engine.llm.estimate import estimate, resolve_spec

MODELS = ("qwen3-0.6b", "llama-3.2-1b", "gemma-3-1b")
PRECISIONS = ("int4", "bf16")
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
QUICK_CONTEXTS = (1024, 32768)

# docs.fastflowlm.com/benchmarks/llama3_results.html: LLaMA 3.2 1B, NPU (FastFlowLM), decode
FLM_LLAMA_BY_CONTEXT = dict(zip(CONTEXTS, (36.7, 35.8, 33.2, 29.6, 24.0, 17.7, 11.5, 6.8)))


def published() -> dict:
    """FastFlowLM figures per model: {'decode': {ctx: tok/s}, 'prefill': {ctx: tok/s}}."""
    from benchmarks.backtest.figures import by_key
    f = by_key()
    return {
        "qwen3-0.6b": {"decode": {1024: f["flm_qwen3_decode"].value},
                       "prefill": {1024: f["flm_qwen3_prefill"].value},
                       "source": f["flm_qwen3_decode"].software + ", " + f["flm_qwen3_decode"].hardware},
        "llama-3.2-1b": {"decode": {1024: f["flm_llama1b_decode"].value},
                         "decode_older_page": FLM_LLAMA_BY_CONTEXT,
                         "prefill": {1024: f["flm_llama1b_prefill"].value},
                         "source": "FastFlowLM docs (1K: facts doc; by context: llama3_results "
                                   "page, older version)"},
    }


def run(quick: bool = False) -> dict:
    contexts = QUICK_CONTEXTS if quick else CONTEXTS
    pub = published()
    rows = []
    t0 = time.perf_counter()
    for model in MODELS:
        _, spec = resolve_spec(model)
        for precision in PRECISIONS:
            for kv in (("bf16", "int8") if precision == "int4" else ("bf16",)):
                for ctx in contexts:
                    r = estimate(spec, precision, ctx, kv_dtype=kv)
                    p = pub.get(model, {})
                    rows.append({
                        "model": model, "precision": precision, "kv_dtype": kv, "context": ctx,
                        "modeled_decode_tok_s": r["modeled_decode_tok_s"],
                        "modeled_prefill_tok_s": r["modeled_prefill_tok_s"],
                        "modeled_ttft_s": ctx / r["modeled_prefill_tok_s"],
                        "mb_per_token": r["mb_per_token"], "kv_mb_per_token": r["kv_mb_per_token"],
                        "floor_ratio": r["floor_ratio"],
                        "beyond_model_max": r["beyond_model_max"],
                        "flm_decode_tok_s": p.get("decode", {}).get(ctx),
                        "flm_decode_tok_s_older_page": p.get("decode_older_page", {}).get(ctx),
                        "flm_prefill_tok_s": p.get("prefill", {}).get(ctx)})
    return {"modeled": True, "generation": "npu4", "rows": rows, "published": {
        m: {k: (v if not isinstance(v, dict) else {str(c): x for c, x in v.items()})
            for k, v in d.items()} for m, d in pub.items()},
        "host_s": time.perf_counter() - t0}


def _fmt(v, f="{:.1f}"):
    return "-" if v is None else f.format(v)


def table(result: dict) -> str:
    head = ("model", "prec", "KV", "context", "decode tok/s", "FLM decode", "prefill tok/s",
            "FLM prefill", "TTFT s", "MB/tok", "x floor")
    cells = [head]
    for r in result["rows"]:
        flm = r["flm_decode_tok_s"] or r["flm_decode_tok_s_older_page"]
        mark = "*" if r["flm_decode_tok_s"] is None and flm is not None else ""
        cells.append((r["model"], r["precision"], r["kv_dtype"],
                      f"{r['context'] // 1024}K" + (" (>max)" if r["beyond_model_max"] else ""),
                      _fmt(r["modeled_decode_tok_s"]), _fmt(flm) + mark,
                      _fmt(r["modeled_prefill_tok_s"], "{:.0f}"),
                      _fmt(r["flm_prefill_tok_s"], "{:.0f}"), _fmt(r["modeled_ttft_s"], "{:.2f}"),
                      _fmt(r["mb_per_token"]), _fmt(r["floor_ratio"], "{:.2f}")))
    w = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c.rjust(x) for c, x in zip(row, w)) for row in cells]
    lines.append("modeled: simulator cost model (npu4); FLM: FastFlowLM published on Krackan "
                 "(int4); * = FastFlowLM's older by-context page")
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1K and 32K only")
    ap.add_argument("--json", action="store_true", help="print only the JSON result")
    a = ap.parse_args()
    res = run(a.quick)
    if not a.json:
        print(table(res))
    else:
        print(json.dumps(res, indent=2, default=float))
