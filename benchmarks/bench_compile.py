"""torch.compile(backend="xdna") vs eager 'xdna' on the same tiny BERT encoder.

Reports, per forward: launches, dispatches and modeled NPU time (simulator cost model: MODELED,
not measured on hardware) for eager op-by-op execution and for the compiled graph; and the
compile time of a cold (empty cache) and a warm (cache hit) start, MEASURED on this host.
`run(quick)` returns a dict; `python benchmarks/bench_compile.py [--quick] [--json PATH]`.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings

import torch


def _model(quick: bool):
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    layers, hidden, seq = (2, 64, 16) if quick else (4, 128, 64)
    m = BertModel(BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                             intermediate_size=4 * hidden, vocab_size=512,
                             max_position_embeddings=128)).eval()
    ids = torch.randint(0, 512, (2, seq))
    return m, ids, {"layers": layers, "hidden": hidden, "seq": seq, "batch": 2}


def _per_forward(fn, dev) -> dict:
    fn()                                   # warm: designs configured, weights resident
    dev.reset_counters()
    t0 = time.perf_counter()
    fn()
    host_s = time.perf_counter() - t0
    c = dev.counters
    return {"launches": c.launches, "dispatches": c.dispatches,
            "modeled_npu_us": round(c.modeled_us, 1), "measured_host_s": round(host_s, 4)}


def _compile_time(model, ids, cache_dir: str) -> dict:
    from torch_xdna.compiler import backend as B
    torch._dynamo.reset()
    c = torch.compile(model, backend="xdna", options={"cache_dir": cache_dir})
    t0 = time.perf_counter()
    with torch.no_grad():
        c(input_ids=ids)
    total = time.perf_counter() - t0
    s = B.HISTORY[-1]
    return {"cache": s.cache, "measured_first_call_s": round(total, 3),
            "measured_backend_s": round(s.compile_s, 4)}


def run(quick: bool = True) -> dict:
    import torch_xdna  # noqa: F401
    from torch_xdna.runtime import get_device
    warnings.simplefilter("ignore")
    dev = get_device()
    model, ids, shape = _model(quick)
    with torch.no_grad():
        ref = model(input_ids=ids).last_hidden_state
    xm, xids = model.to("xdna"), ids.to("xdna")
    with torch.no_grad():
        eager = _per_forward(lambda: xm(input_ids=xids), dev)
        torch._dynamo.reset()
        compiled_fn = torch.compile(xm, backend="xdna", options={"cache": False})
        compiled = _per_forward(lambda: compiled_fn(input_ids=xids), dev)
        err = (compiled_fn(input_ids=xids).last_hidden_state.cpu() - ref).abs().max().item()
    cpu_model = model.to("cpu")
    with tempfile.TemporaryDirectory() as d:
        cold = _compile_time(cpu_model, ids, d)
        warm = _compile_time(cpu_model, ids, d)
    torch._dynamo.reset()
    return {
        "model": {"kind": "BertModel (random weights)", **shape},
        "eager": eager, "compiled": compiled,
        "ratio_launches": round(eager["launches"] / max(1, compiled["launches"]), 2),
        "ratio_dispatches": round(eager["dispatches"] / max(1, compiled["dispatches"]), 2),
        "ratio_modeled_us": round(eager["modeled_npu_us"] / max(1e-9, compiled["modeled_npu_us"]), 2),
        "compiled_max_abs_err_vs_cpu": err,
        "compile_cold": cold, "compile_warm": warm,
        "notes": "modeled_* = simulator cost model (not hardware); measured_* = wall time on this host",
    }


def table(r: dict) -> str:
    e, c = r["eager"], r["compiled"]
    rows = [("per forward", "eager xdna", "compiled xdna", "ratio"),
            ("launches", e["launches"], c["launches"], r["ratio_launches"]),
            ("dispatches", e["dispatches"], c["dispatches"], r["ratio_dispatches"]),
            ("NPU time, us (modeled)", e["modeled_npu_us"], c["modeled_npu_us"], r["ratio_modeled_us"]),
            ("compile, first call s (measured)", "-", f"cold {r['compile_cold']['measured_first_call_s']}"
             f" / warm {r['compile_warm']['measured_first_call_s']}", ""),
            ("xdna backend s (measured)", "-", f"cold {r['compile_cold']['measured_backend_s']}"
             f" / warm {r['compile_warm']['measured_backend_s']}", "")]
    w = [max(len(str(x[i])) for x in rows) for i in range(4)]
    return "\n".join("  ".join(str(x).ljust(w[i]) for i, x in enumerate(row)) for row in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the result dict here")
    a = ap.parse_args()
    r = run(a.quick)
    print(f"model: {r['model']}")
    print(table(r))
    print(r["notes"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
