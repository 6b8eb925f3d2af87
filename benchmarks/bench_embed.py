"""Embedding throughput and serving latency.

Numbers, labeled by where they come from:
  * engine on the simulator: sentences/s of HOST wall time (measured; the sim executes the NPU
    numerics on the CPU), tokens processed (padding included) vs real tokens, and the NPU time from
    the cost model (MODELED, not measured);
  * sentence-transformers on the CPU, same sentences, same batch size, same thread count (measured);
  * /v1/embeddings throughput (sentences/s), p50/p95 latency and requests merged per device step,
    for the same 40 requests sent by 1 client and by 4 concurrent clients (closed loop: each
    client sends its next request when the last is answered), alternated, against one `xdna
    serve` subprocess on loopback with the same torch thread count (measured; --no-server skips
    it). Each request carries 1-8 sentences (uniform) of the 5-120-word mix, as RAG indexers and
    chat apps send; with such small requests the server's merging of concurrent requests into one
    device step (server/worker.py, gather window --gather-ms) is what can raise throughput with
    clients. A CPU-bound host with large requests cannot gain from it.
Conditions: a seeded corpus of 512 sentences of 5-120 words (`realistic_corpus`), batch 32,
torch.set_num_threads(1) for both contenders, engine and sentence-transformers runs alternated,
median of 5 (min/max printed). Host load from other processes moves both; compare the ratio.
Run: python benchmarks/bench_embed.py [--quick] [--no-server] [--server-only] [--repeats N]
     [--threads N] [--gather-ms MS] [--save-vectors PT] [--compare PT]
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
        from torch_xdna.engine.embed.embedder import Embedder
        self.texts = texts
        self.emb = Embedder.load(max_batch=batch)
        self.emb.embed(texts)                      # warm: every bucket's plan and workspace
        self.last: dict = {}

    def run(self) -> float:
        from torch_xdna.engine.embed.embedder import EmbedStats
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
        from torch_xdna.engine.embed.embedder import default_model_dir
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


def server_work(texts: list[str], requests: int, seed: int = 0) -> list[list[str]]:
    """`requests` /v1/embeddings bodies of 1-8 sentences each (uniform), drawn from the 5-120-word
    mix: what RAG indexers and chat apps send (a query, a chunk or a few)."""
    rng = random.Random(seed)
    return [rng.sample(texts, rng.randint(1, 8)) for _ in range(requests)]


class ServerProcess:
    """`xdna serve` in its own process (clients and server do not share a GIL, as in use), with
    `threads` torch threads; its device worker merges concurrent embedding requests."""

    def __init__(self, threads: int, gather_ms: float | None = None,
                 host_threads: int | None = None):
        import os
        import socket
        import subprocess
        import sys
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            self.port = sk.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        cmd = [sys.executable, "-m", "torch_xdna.cli.main", "serve", "--port", str(self.port),
               "--log-level", "warning"]
        if gather_ms is not None:
            cmd += ["--gather-ms", str(gather_ms)]
        if host_threads is not None:
            cmd += ["--host-threads", str(host_threads)]
        self.proc = subprocess.Popen(cmd, env=env)

    def __enter__(self) -> "ServerProcess":
        import httpx
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"xdna serve exited with code {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError("xdna serve did not answer /health within 300 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except Exception:                       # noqa: BLE001 - a stuck server is killed
            self.proc.kill()


def bench_server(url: str, work: list[list[str]], clients: int, time_limit_s: float) -> dict:
    """The same `work` (list of request bodies) shared out over `clients` threads in a closed
    loop (each sends its next request when the last one is answered), so sentences/s compares
    directly across client counts. Jobs per device step come from each response's
    x-xdna-merged-requests header (a step that merged m requests answers m of them)."""
    import httpx
    latencies: list[float] = []
    merged: list[int] = []
    modeled_ms = [0.0]                  # modeled NPU time of the steps (each step once)
    codes: dict[int, int] = {}
    done = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + time_limit_s

    def client(mine: list[list[str]]) -> None:
        with httpx.Client(base_url=url, timeout=max(5.0, time_limit_s)) as http:
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
                        m = int(r.headers.get("x-xdna-merged-requests", "1"))
                        merged.append(m)
                        modeled_ms[0] += float(r.headers.get("x-xdna-modeled-npu-ms", "0")) / m
                        done[0] += len(batch)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(work[i::clients],)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3) if lat else (lambda q: None)
    steps = sum(1.0 / m for m in merged)
    return {"clients": clients, "requests": sum(codes.values()), "status_counts": codes,
            "sentences": done[0], "measured_sent_per_s": done[0] / wall if wall else None,
            "measured_p50_ms": pct(0.50), "measured_p95_ms": pct(0.95),
            "measured_mean_ms": statistics.fmean(lat) * 1e3 if lat else None,
            "device_steps": steps, "jobs_per_step": len(merged) / steps if steps else None,
            "modeled_npu_ms": modeled_ms[0],
            "modeled_npu_sent_per_s": done[0] / modeled_ms[0] * 1e3 if modeled_ms[0] else None}


def bench_server_scaling(texts: list[str], requests: int, repeats: int, time_limit_s: float,
                         threads: int = 1, gather_ms: float | None = None,
                         host_threads: int | None = None) -> dict:
    """Throughput, latency and merging at 1 client and at 4, alternated, `repeats` runs each,
    against one `xdna serve` process, warmed first with the same requests (every shape planned)."""
    work = server_work(texts, requests)
    runs: dict[int, list[dict]] = {1: [], 4: []}
    with ServerProcess(threads, gather_ms, host_threads) as srv:
        # warm: plan the (batch, seq) shapes the runs use, as a long-running server has (a new
        # shape's first run plans its designs: ~1-2 s of host time here, once per shape)
        bench_server(srv.url, work, 4, time_limit_s)
        bench_server(srv.url, server_work(texts, 24, seed=1), 1, time_limit_s)
        for _ in range(repeats):
            for c in (1, 4):
                runs[c].append(bench_server(srv.url, work, c, time_limit_s))
    out: dict = {"conditions": {"requests_per_run": requests, "sentences_per_request": "1-8",
                                "sentence_pool": len(texts), "server_threads": threads,
                                "gather_ms": 20.0 if gather_ms is None else gather_ms,
                                "host_threads": host_threads or "default (cores, max 2)",
                                "repeats": repeats, "alternated": True,
                                "server": "xdna serve subprocess, loopback"}}
    for c, rs in runs.items():
        out[f"{c}_client" + ("s" if c > 1 else "")] = {
            k: _spread([r[k] for r in rs if r[k] is not None])
            for k in ("measured_sent_per_s", "measured_p50_ms", "measured_p95_ms",
                      "jobs_per_step", "modeled_npu_sent_per_s")}
    out["ratio_4_vs_1"] = (out["4_clients"]["measured_sent_per_s"]["median"]
                           / out["1_client"]["measured_sent_per_s"]["median"])
    out["runs"] = runs
    return out


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
        result["server_loopback"] = server_scaling(quick, repeats, threads)
    result["note"] = ("measured = host wall clock on this machine; modeled = simulator cost model "
                      "of the NPU (not a hardware measurement)")
    print_table(result)
    return result


def server_scaling(quick: bool, repeats: int | None, threads: int,
                   gather_ms: float | None = None, host_threads: int | None = None) -> dict:
    """The /v1/embeddings comparison at its default size (--quick: 12 requests, 1 repeat)."""
    return bench_server_scaling(realistic_corpus(512), requests=12 if quick else 40,
                                repeats=repeats or (1 if quick else 3),
                                time_limit_s=300 if quick else 900, threads=threads,
                                gather_ms=gather_ms, host_threads=host_threads)


def _mmm(d: dict | None, spec: str = ".1f") -> str:
    return f"{d['median']:{spec}} ({d['min']:{spec}}-{d['max']:{spec}})" if d else "n/a"


def server_rows(v: dict) -> list[tuple[str, str, str, str]]:
    rows = []
    for key, label in (("1_client", "1 client"), ("4_clients", "4 clients")):
        d = v[key]
        rows += [(f"/v1/embeddings {label}", _mmm(d["measured_sent_per_s"]), "sent/s", "measured"),
                 (f"  p50 latency ({label})", _mmm(d["measured_p50_ms"], ".0f"), "ms", "measured"),
                 (f"  p95 latency ({label})", _mmm(d["measured_p95_ms"], ".0f"), "ms", "measured"),
                 (f"  requests per device step ({label})", _mmm(d["jobs_per_step"], ".2f"), "",
                  "counted"),
                 (f"  NPU throughput ({label})", _mmm(d.get("modeled_npu_sent_per_s")), "sent/s",
                  "modeled")]
    rows.append(("/v1/embeddings 4 clients / 1 client", f"{v['ratio_4_vs_1']:.2f}", "x",
                 "measured"))
    return rows


def print_rows(rows: list[tuple[str, str, str, str]]) -> None:
    print(f"{'metric':44} {'med (min-max)':>24} {'unit':6} source")
    for name, val, unit, src in rows:
        print(f"{name:44} {val:>24} {unit:6} {src}")


def print_server(v: dict) -> None:
    c = v["conditions"]
    print_rows(server_rows(v))
    print(f"({c['requests_per_run']} requests of {c['sentences_per_request']} sentences per run, "
          f"{c['server']}, {c['server_threads']} torch thread(s), gather window "
          f"{c['gather_ms']:g} ms, host lanes {c.get('host_threads')}, {c['repeats']} "
          f"alternated runs per client count)")


def print_table(r: dict) -> None:
    e, s, c = r["engine_sim"], r["sentence_transformers_cpu"], r["conditions"]

    def f(x, spec=".1f"):
        return "n/a" if x is None else format(x, spec)

    mmm = _mmm
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
    print_rows(rows)
    print(f"({c['sentences']} sentences of 5-120 words, batch {c['batch']}, {c['threads']} "
          f"thread(s) each, {c['repeats']} alternated runs; {e['real_tokens']} real tokens, "
          f"{e['processed_tokens']} processed, {e['batches']} batches)")
    if r.get("server_loopback"):
        print_server(r["server_loopback"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small run (64 sentences, 2 repeats)")
    ap.add_argument("--no-server", action="store_true", help="skip the /v1/embeddings load test")
    ap.add_argument("--repeats", type=int, default=None, help="alternated runs per contender")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both contenders")
    ap.add_argument("--server-only", action="store_true",
                    help="only the /v1/embeddings 1-vs-4-client comparison")
    ap.add_argument("--gather-ms", type=float, default=None, metavar="MS",
                    help="the server's embedding gather window (xdna serve --gather-ms)")
    ap.add_argument("--host-threads", type=int, default=None, metavar="N",
                    help="the server's simulator host lanes (xdna serve --host-threads)")
    ap.add_argument("--save-vectors", metavar="PT", help="write the engine's vectors (torch.save)")
    ap.add_argument("--compare", metavar="PT", help="min cosine of the engine's vectors vs a "
                    "file written by --save-vectors (e.g. by an older checkout)")
    args = ap.parse_args()
    if args.server_only:
        r = server_scaling(args.quick, args.repeats, args.threads, args.gather_ms,
                           args.host_threads)
        print(json.dumps(r, indent=2, default=str))
        print_server(r)
        return
    r = run(args.quick, not args.no_server, args.repeats, args.threads,
            save=args.save_vectors, compare=args.compare)
    print(json.dumps(r, indent=2, default=str))


if __name__ == "__main__":
    main()
