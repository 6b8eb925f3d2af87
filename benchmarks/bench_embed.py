"""Embedding throughput and serving latency.

Three numbers, labeled by where they come from:
  * engine on the simulator: embeddings/s of HOST wall time (measured; the sim executes the NPU
    numerics on the CPU) and the NPU time per batch from the cost model (MODELED, not measured);
  * sentence-transformers on the CPU, same sentences, same run (measured);
  * /v1/embeddings p50/p95 latency under a fixed concurrent load on loopback (measured, bounded
    in request count and time).
Run: python benchmarks/bench_embed.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

WORDS = ("the npu streams weights from memory while the cores multiply tiles of numbers and a "
         "small encoder turns every sentence into a vector that search engines compare quickly "
         "café naïve Köln 東京 🚀 data model query answer token batch latency").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """Deterministic sentences of varied length (2..60 words)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.choice((2, 5, 8, 12, 20, 40, 60))))
            .capitalize() + rng.choice((".", "?", "!")) for _ in range(n)]


def bench_engine(texts: list[str]) -> dict:
    from torch_xdna.engine.embedder import EmbedStats, Embedder
    emb = Embedder.load()
    try:
        emb.embed(texts)                          # warm: plans, workspaces
        stats = EmbedStats()
        t0 = time.perf_counter()
        emb.embed(texts, stats)
        wall = time.perf_counter() - t0
        modeled_s = stats.modeled_us / 1e6
        return {
            "backend": emb.dev.backend, "inputs": len(texts), "tokens": stats.tokens,
            "batches": stats.batches, "dispatches": stats.dispatches,
            "measured_host_s": wall, "measured_host_emb_per_s": len(texts) / wall,
            "modeled_npu_ms_per_batch": stats.modeled_us / 1e3 / stats.batches,
            "modeled_npu_s": modeled_s,
            "modeled_npu_emb_per_s": len(texts) / modeled_s if modeled_s else None,
            "batch_shapes": sorted(set(map(tuple, stats.shapes))),
        }
    finally:
        emb.close()


def bench_sentence_transformers(texts: list[str]) -> dict:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return {"skipped": "sentence-transformers not installed"}
    from torch_xdna.engine.embedder import default_model_dir
    model = SentenceTransformer(str(default_model_dir()), device="cpu")
    model.encode(texts[:32], batch_size=32)
    t0 = time.perf_counter()
    model.encode(texts, batch_size=32)
    wall = time.perf_counter() - t0
    return {"inputs": len(texts), "measured_cpu_s": wall, "measured_cpu_emb_per_s": len(texts) / wall}


def bench_server(texts: list[str], clients: int, requests_per_client: int,
                 time_limit_s: float) -> dict:
    import httpx
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    app = create_app(ServerConfig())
    latencies: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + time_limit_s

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=server.url, timeout=max(5.0, time_limit_s)) as http:
            for _ in range(requests_per_client):
                if time.monotonic() > deadline:
                    return
                batch = rng.sample(texts, rng.randint(1, 4))
                t0 = time.perf_counter()
                r = http.post("/v1/embeddings", json={"input": batch})
                dt = time.perf_counter() - t0
                with lock:
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        latencies.append(dt)

    with BackgroundServer(app) as server:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        merged = app.state.server.worker.merged_jobs
    lat = sorted(latencies)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: None)
    return {"clients": clients, "requests": sum(codes.values()), "status_counts": codes,
            "measured_p50_ms": pct(0.50), "measured_p95_ms": pct(0.95),
            "measured_mean_ms": statistics.fmean(lat) * 1e3 if lat else None,
            "measured_req_per_s": len(lat) / wall if wall else None,
            "requests_merged_into_shared_batches": merged}


def run(quick: bool) -> dict:
    n = 48 if quick else 256
    texts = sentences(n)
    result = {
        "engine_sim": bench_engine(texts),
        "sentence_transformers_cpu": bench_sentence_transformers(texts),
        "server_loopback": bench_server(texts[:32], clients=4 if quick else 8,
                                        requests_per_client=5 if quick else 20,
                                        time_limit_s=60 if quick else 180),
        "note": "measured = host wall clock on this machine; modeled = simulator cost model of "
                "the NPU (not a hardware measurement)",
    }
    print_table(result)
    return result


def print_table(r: dict) -> None:
    e, s, v = r["engine_sim"], r["sentence_transformers_cpu"], r["server_loopback"]

    def f(x, spec=".1f"):
        return "n/a" if x is None else format(x, spec)
    rows = [
        ("engine (sim) host throughput", f(e["measured_host_emb_per_s"]), "emb/s", "measured"),
        ("engine NPU time per batch", f(e["modeled_npu_ms_per_batch"], ".2f"), "ms", "modeled"),
        ("engine NPU throughput", f(e["modeled_npu_emb_per_s"]), "emb/s", "modeled"),
        ("sentence-transformers CPU", f(s.get("measured_cpu_emb_per_s")), "emb/s", "measured"),
        (f"/v1/embeddings p50 ({v['clients']} clients)", f(v["measured_p50_ms"]), "ms", "measured"),
        (f"/v1/embeddings p95 ({v['clients']} clients)", f(v["measured_p95_ms"]), "ms", "measured"),
    ]
    print(f"{'metric':40} {'value':>10} {'unit':6} source")
    for name, val, unit, src in rows:
        print(f"{name:40} {val:>10} {unit:6} {src}")
    print(f"({e['inputs']} sentences, {e['tokens']} tokens, {e['batches']} batches; server: "
          f"{v['requests']} requests, status {v['status_counts']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (a minute or less)")
    args = ap.parse_args()
    print(json.dumps(run(args.quick), indent=2, default=str))


if __name__ == "__main__":
    main()
