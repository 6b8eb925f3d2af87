"""Embedding throughput and serving latency.

Numbers, labeled by where they come from:
  * engine on the simulator: sentences/s of HOST wall time (measured; the sim executes the NPU
    numerics on the CPU), tokens processed (padding included) vs real tokens, and the NPU time from
    the cost model (MODELED, not measured);
  * sentence-transformers on the CPU, same sentences, same batch size, same thread count (measured);
  * /v1/embeddings p50/p95 latency under a fixed concurrent load on loopback (measured, bounded
    in request count and time; skip with --no-server).
Conditions: a seeded corpus of 512 sentences of 5-120 words (`realistic_corpus`), batch 32,
torch.set_num_threads(1) for both contenders, engine and sentence-transformers runs alternated,
median of 5 (min/max printed). Host load from other processes moves both; compare the ratio.
Run: python benchmarks/bench_embed.py [--quick] [--no-server] [--repeats N] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

# common English words plus the domain words and non-ASCII a real corpus has
VOCAB = ("the of and to in is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no what up out about who them more some could into time only other new these two "
         "may then do first any my now such like our over man me even most made after also did "
         "many before must through back years where much your way well down should because each "
         "just those people how too little state good very make world still own see men work "
         "long get here between both life being under never day same another know while last "
         "might us great old year off come since against go came right used take three model "
         "data search query vector embedding network latency throughput memory kernel compiler "
         "runtime batch token sentence corpus document retrieval index cluster server neural "
         "processor accelerator benchmark measurement encoder transformer attention café naïve "
         "résumé Zürich 東京 2024 3.5 100 GPU NPU CPU API HTTP JSON").split()
WORDS = VOCAB                  # older name


def realistic_corpus(n: int = 512, lo: int = 5, hi: int = 120, seed: int = 0) -> list[str]:
    """Deterministic sentences of lo..hi words (uniform), with clause punctuation: about 1.3
    tokens a word, so 8..160 tokens with the [CLS]/[SEP] pair (inside max_seq_length 256)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(lo, hi)
        words = [rng.choice(VOCAB) for _ in range(k)]
        for j in range(7, k, rng.randint(6, 14)):
            words[j] += rng.choice((",", ",", ";", " -", ":"))
        out.append(" ".join(words).capitalize() + rng.choice((".", ".", "?", "!")))
    return out


def sentences(n: int, seed: int = 0) -> list[str]:
    """The realistic mix (kept under the old name for callers)."""
    return realistic_corpus(n, seed=seed)


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


class EngineRunner:
    """The engine on the default device, warmed (plans, workspaces) before timing."""

    def __init__(self, texts: list[str], batch: int):
        from torch_xdna.engine.embedder import Embedder
        self.texts = texts
        self.emb = Embedder.load(max_batch=batch)
        self.emb.embed(texts)                      # warm: every bucket's plan and workspace
        self.last: dict = {}

    def run(self) -> float:
        from torch_xdna.engine.embedder import EmbedStats
        stats = EmbedStats()
        t0 = time.perf_counter()
        self.vectors = self.emb.embed(self.texts, stats)
        wall = time.perf_counter() - t0
        processed = sum(b * s for b, s in stats.shapes)
        self.last = {"backend": self.emb.dev.backend, "inputs": len(self.texts),
                     "real_tokens": stats.tokens, "processed_tokens": processed,
                     "padding_ratio": processed / stats.tokens, "batches": stats.batches,
                     "dispatches": stats.dispatches, "modeled_npu_s": stats.modeled_us / 1e6,
                     "modeled_npu_ms_per_batch": stats.modeled_us / 1e3 / stats.batches,
                     "modeled_npu_emb_per_s": (len(self.texts) / (stats.modeled_us / 1e6)
                                               if stats.modeled_us else None),
                     "batch_shapes": sorted(set(map(tuple, stats.shapes)))}
        return len(self.texts) / wall

    def close(self) -> None:
        self.emb.close()


class STRunner:
    """sentence-transformers on the CPU with the same model folder and batch size."""

    def __init__(self, texts: list[str], batch: int):
        from sentence_transformers import SentenceTransformer
        from torch_xdna.engine.embedder import default_model_dir
        self.texts, self.batch = texts, batch
        self.model = SentenceTransformer(str(default_model_dir()), device="cpu")
        self.model.encode(texts[:batch], batch_size=batch)
        tok = self.model.tokenizer
        lens = [min(len(x), self.model.max_seq_length) for x in
                tok(texts, add_special_tokens=True)["input_ids"]]
        # sentence-transformers sorts by text length (characters, longest first) and pads each
        # batch to its longest input
        srt = [lens[i] for i in sorted(range(len(texts)), key=lambda i: -len(texts[i]))]
        self.real_tokens = sum(lens)
        self.processed_tokens = sum(len(srt[i:i + batch]) * max(srt[i:i + batch])
                                    for i in range(0, len(srt), batch))

    def run(self) -> float:
        t0 = time.perf_counter()
        self.vectors = self.model.encode(self.texts, batch_size=self.batch, convert_to_tensor=True)
        return len(self.texts) / (time.perf_counter() - t0)


def bench_embeddings(texts: list[str], batch: int, repeats: int, threads: int) -> dict:
    """Engine and sentence-transformers, alternated run by run, `repeats` runs each."""
    import torch
    torch.set_num_threads(threads)
    engine = EngineRunner(texts, batch)
    try:
        st: STRunner | None = STRunner(texts, batch)
    except ImportError:
        st = None
    eng_rates: list[float] = []
    st_rates: list[float] = []
    try:
        for _ in range(repeats):
            eng_rates.append(engine.run())
            if st is not None:
                st_rates.append(st.run())
        result = {"conditions": {"sentences": len(texts), "batch": batch, "threads": threads,
                                 "repeats": repeats, "alternated": True},
                  "engine_sim": {**engine.last, "measured_host_sent_per_s": _spread(eng_rates)}}
        if st is None:
            result["sentence_transformers_cpu"] = {"skipped": "sentence-transformers not installed"}
        else:
            cos = torch.nn.functional.cosine_similarity(engine.vectors, st.vectors.float(), dim=-1)
            result["sentence_transformers_cpu"] = {
                "measured_cpu_sent_per_s": _spread(st_rates), "real_tokens": st.real_tokens,
                "processed_tokens": st.processed_tokens,
                "padding_ratio": st.processed_tokens / st.real_tokens}
            result["engine_vs_st"] = {
                "median_ratio": statistics.median(eng_rates) / statistics.median(st_rates),
                "min_cosine_engine_vs_st": float(cos.min())}
        return result
    finally:
        engine.close()


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


def run(quick: bool, server: bool = True, repeats: int | None = None, threads: int = 1,
        batch: int = 32) -> dict:
    texts = realistic_corpus(64 if quick else 512)
    result = bench_embeddings(texts, batch, repeats or (2 if quick else 5), threads)
    if server:
        result["server_loopback"] = bench_server(texts[:32], clients=4 if quick else 8,
                                                 requests_per_client=5 if quick else 20,
                                                 time_limit_s=60 if quick else 180)
    result["note"] = ("measured = host wall clock on this machine; modeled = simulator cost model "
                      "of the NPU (not a hardware measurement)")
    print_table(result)
    return result


def print_table(r: dict) -> None:
    e, s, c = r["engine_sim"], r["sentence_transformers_cpu"], r["conditions"]

    def f(x, spec=".1f"):
        return "n/a" if x is None else format(x, spec)

    def mmm(d):
        return (f"{d['median']:.1f} ({d['min']:.1f}-{d['max']:.1f})") if d else "n/a"
    st_rate = s.get("measured_cpu_sent_per_s")
    rows = [
        ("engine (sim) host, med (min-max)", mmm(e["measured_host_sent_per_s"]), "sent/s", "measured"),
        ("sentence-transformers CPU", mmm(st_rate), "sent/s", "measured"),
        ("engine / sentence-transformers", f(r.get("engine_vs_st", {}).get("median_ratio"), ".2f"),
         "x", "measured"),
        ("engine tokens processed / real", f(e["padding_ratio"], ".3f"), "x", "counted"),
        ("sentence-transformers processed / real", f(s.get("padding_ratio"), ".3f"), "x", "counted"),
        ("engine NPU time (whole corpus)", f(e["modeled_npu_s"] * 1e3, ".1f"), "ms", "modeled"),
        ("engine NPU throughput", f(e["modeled_npu_emb_per_s"]), "sent/s", "modeled"),
    ]
    v = r.get("server_loopback")
    if v:
        rows += [(f"/v1/embeddings p50 ({v['clients']} clients)", f(v["measured_p50_ms"]), "ms",
                  "measured"),
                 (f"/v1/embeddings p95 ({v['clients']} clients)", f(v["measured_p95_ms"]), "ms",
                  "measured")]
    print(f"{'metric':40} {'value':>22} {'unit':6} source")
    for name, val, unit, src in rows:
        print(f"{name:40} {val:>22} {unit:6} {src}")
    print(f"({c['sentences']} sentences of 5-120 words, batch {c['batch']}, {c['threads']} "
          f"thread(s) each, {c['repeats']} alternated runs; {e['real_tokens']} real tokens, "
          f"{e['processed_tokens']} processed, {e['batches']} batches)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (64 sentences, 2 repeats)")
    ap.add_argument("--no-server", action="store_true", help="skip the /v1/embeddings load test")
    ap.add_argument("--repeats", type=int, default=None, help="alternated runs per contender")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both contenders")
    args = ap.parse_args()
    print(json.dumps(run(args.quick, not args.no_server, args.repeats, args.threads), indent=2,
                     default=str))


if __name__ == "__main__":
    main()
