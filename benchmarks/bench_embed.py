"""Embedding throughput and serving latency.

Numbers, labeled by where they come from:
  * engine on the simulator: sentences/s of HOST wall time (measured; the sim executes the NPU
    numerics on the CPU), tokens processed (padding included) vs real tokens, and the NPU time from
    the cost model (MODELED, not measured);
  * sentence-transformers on the CPU, same sentences, same batch size, same thread count (measured);
  * /v1/embeddings throughput (sentences/s) for the same requests sent by 1 client and by 4
    concurrent clients, alternated, and p95 latency, on loopback (measured; skip with --no-server).
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
                  "engine_sim": {**engine.last, "measured_host_sent_per_s": _spread(eng_rates),
                                 "_vectors": engine.vectors}}
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


def bench_server(texts: list[str], clients: int, requests: int, time_limit_s: float) -> dict:
    """`requests` /v1/embeddings requests of 1-4 sentences shared out over `clients` threads on
    loopback: the same work at every client count, so sentences/s compares directly."""
    import httpx
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    app = create_app(ServerConfig())
    rng = random.Random(0)
    work = [rng.sample(texts, rng.randint(1, 4)) for _ in range(requests)]
    latencies: list[float] = []
    codes: dict[int, int] = {}
    done = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + time_limit_s

    def client(mine: list[list[str]]) -> None:
        with httpx.Client(base_url=server.url, timeout=max(5.0, time_limit_s)) as http:
            for batch in mine:
                if time.monotonic() > deadline:
                    return
                t0 = time.perf_counter()
                r = http.post("/v1/embeddings", json={"input": batch})
                dt = time.perf_counter() - t0
                with lock:
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        latencies.append(dt)
                        done[0] += len(batch)

    with BackgroundServer(app) as server:
        with httpx.Client(base_url=server.url, timeout=60) as http:   # warm the shapes
            for batch in work[:8]:
                http.post("/v1/embeddings", json={"input": batch})
        merged0 = app.state.server.worker.merged_jobs
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(work[i::clients],))
                   for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        merged = app.state.server.worker.merged_jobs - merged0
    lat = sorted(latencies)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: None)
    return {"clients": clients, "requests": sum(codes.values()), "status_counts": codes,
            "measured_sent_per_s": done[0] / wall if wall else None,
            "measured_p50_ms": pct(0.50), "measured_p95_ms": pct(0.95),
            "measured_mean_ms": statistics.fmean(lat) * 1e3 if lat else None,
            "requests_merged_into_shared_batches": merged}


def bench_server_scaling(texts: list[str], requests: int, repeats: int,
                         time_limit_s: float) -> dict:
    """Throughput at 1 client and at 4, alternated, `repeats` runs each."""
    runs: dict[int, list[dict]] = {1: [], 4: []}
    for _ in range(repeats):
        for c in (1, 4):
            runs[c].append(bench_server(texts, c, requests, time_limit_s))
    rate = {c: _spread([r["measured_sent_per_s"] for r in rs]) for c, rs in runs.items()}
    return {"requests_per_run": requests, "sent_per_s_1_client": rate[1],
            "sent_per_s_4_clients": rate[4],
            "ratio_4_vs_1": rate[4]["median"] / rate[1]["median"],
            "last_4_client_run": runs[4][-1]}


def run(quick: bool, server: bool = True, repeats: int | None = None, threads: int = 1,
        batch: int = 32, save: str | None = None, compare: str | None = None) -> dict:
    import torch
    texts = realistic_corpus(64 if quick else 512)
    result = bench_embeddings(texts, batch, repeats or (2 if quick else 5), threads)
    vecs = result["engine_sim"].pop("_vectors")
    if save:
        torch.save(vecs, save)
    if compare:
        old = torch.load(compare)
        result["engine_vs_saved"] = {"file": compare, "min_cosine": float(
            torch.nn.functional.cosine_similarity(vecs, old, dim=-1).min())}
    if server:
        result["server_loopback"] = bench_server_scaling(
            texts[:64], requests=16 if quick else 64, repeats=repeats or (1 if quick else 3),
            time_limit_s=300 if quick else 900)
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
        ("min cosine engine vs sentence-transformers",
         f(r.get("engine_vs_st", {}).get("min_cosine_engine_vs_st"), ".6f"), "", "computed"),
    ]
    if "engine_vs_saved" in r:
        rows.append(("min cosine engine vs saved vectors", f(r["engine_vs_saved"]["min_cosine"],
                                                            ".6f"), "", "computed"))
    v = r.get("server_loopback")
    if v:
        last = v["last_4_client_run"]
        rows += [("/v1/embeddings 1 client", mmm(v["sent_per_s_1_client"]), "sent/s", "measured"),
                 ("/v1/embeddings 4 clients", mmm(v["sent_per_s_4_clients"]), "sent/s",
                  "measured"),
                 ("/v1/embeddings 4 clients / 1 client", f(v["ratio_4_vs_1"], ".2f"), "x",
                  "measured"),
                 ("/v1/embeddings p95 (4 clients)", f(last["measured_p95_ms"]), "ms", "measured")]
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
    ap.add_argument("--server-only", action="store_true",
                    help="only the /v1/embeddings 1-vs-4-client comparison")
    ap.add_argument("--save-vectors", metavar="PT", help="write the engine's vectors (torch.save)")
    ap.add_argument("--compare", metavar="PT", help="min cosine of the engine's vectors vs a "
                    "file written by --save-vectors (e.g. by an older checkout)")
    args = ap.parse_args()
    if args.server_only:
        r = bench_server_scaling(realistic_corpus(64), requests=16 if args.quick else 64,
                                 repeats=args.repeats or (1 if args.quick else 3),
                                 time_limit_s=900)
        print(json.dumps(r, indent=2, default=str))
        return
    r = run(args.quick, not args.no_server, args.repeats, args.threads,
            save=args.save_vectors, compare=args.compare)
    print(json.dumps(r, indent=2, default=str))


if __name__ == "__main__":
    main()
