"""Soak benchmark: does `xdna serve` hold its memory, files and threads over many requests?

A bounded, seeded mix of requests against the server app on a loopback port (uvicorn, the same
transport as `xdna serve`), from several client threads so that chats decode in batches: chat
(streamed and not, with tools, with a json_schema response_format), text completions (streamed
and not), Ollama chat, embeddings, rerank and transcription, with random disconnects (a stream
closed after its first event, a request abandoned by a short client timeout). The models are tiny
random-weight ones built here (a Qwen3 decoder, a micro Whisper, a BERT cross-encoder) plus the
bundled all-MiniLM-L6-v2 embedder; nothing downloads.

Every `--sample-every` requests it reads /metrics as an operator would: process RSS, open files,
OS threads, live device buffers and bytes, freed device buffers still referenced, bounded host
caches. After warm-up (the first `--warmup` requests: programs built, caches filled) it fits the
RSS per request (least squares) and reports the growth per 1,000 requests; the run FAILS when
that is above `--max-growth-mb` (default 5 MB / 1,000), when live device bytes or buffers at the
end differ from the idle figure taken after warm-up, when a freed buffer is still referenced,
when open files or threads grow by more than a few, or when any request answers 5xx.
All figures are measured on this host; the device is the simulator (no NPU time is claimed).

    python benchmarks/bench_soak.py [--requests N] [--minutes T] [--max-batch B] [--json]
    xdna bench soak            # the quick run (--full: 20,000 requests)
"""
from __future__ import annotations

import argparse
import io
import json
import random
import shutil
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL, ASR, RERANK = "tiny-qwen3", "whisper-micro", "tiny-cross-encoder"
MIX = {          # request kind -> weight (of 100)
    "chat": 16, "chat_stream": 12, "chat_tools": 6, "chat_schema": 6, "completion": 8,
    "completion_stream": 6, "ollama_chat": 6, "embeddings": 20, "rerank": 10,
    "transcription": 2, "disconnect_stream": 4, "disconnect_timeout": 4}
USERS = ["hello", "what time is it in Oslo?", "the quick brown fox", "numbers 1 2 3",
         "how are you today?", "a small model runs on the npu", "thanks, see you", "a b c d e f"]
SYSTEMS = ["You are terse.", "You answer in one line.", None]
TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "time in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}},
                                               "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"},
                                           "ok": {"type": "boolean"}}, "required": ["n"]}
DOCS = ["Paris is the capital of France.", "The fox jumps.", "Berlin is in Germany", "Lyon"]


# --- models ------------------------------------------------------------------------------------
def build_models(root: Path) -> dict[str, Path]:
    """The tiny random-weight models the soak serves (built from the tests' fixture builders)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from llm_fixtures import build_model
    from whisper_fixtures import make_whisper_dir
    build_model("qwen3", root / MODEL, seed=5)
    make_whisper_dir(root / ASR)
    return {MODEL: root / MODEL, ASR: root / ASR, RERANK: _cross_encoder(root / RERANK)}


def _cross_encoder(d: Path) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    from torch_xdna.engine.embed.embedder import default_model_dir
    cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128, num_labels=1)
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).eval().save_pretrained(d)
    src = default_model_dir()                # the bundled MiniLM's vocabulary
    for f in ("tokenizer.json", "vocab.txt", "special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(src / f, d / f)
    return d


def wav_bytes(seconds: float = 1.0) -> bytes:
    sys.path.insert(0, str(ROOT / "tests"))
    import numpy as np
    from whisper_fixtures import tone
    pcm = (np.clip(tone(seconds), -1, 1) * 32767).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm)
    return buf.getvalue()


# --- requests ----------------------------------------------------------------------------------
def _messages(rng: random.Random) -> list[dict]:
    system = rng.choice(SYSTEMS)
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": rng.choice(USERS)}]


def one_request(client, kind: str, rng: random.Random, audio: bytes) -> int:
    """Send one request of `kind`; its HTTP status (0: the client gave up on purpose)."""
    import httpx
    chat = {"model": MODEL, "messages": _messages(rng), "max_tokens": rng.choice((4, 8, 12)),
            "temperature": rng.choice((0, 0.7))}
    if kind == "chat":
        return client.post("/v1/chat/completions", json=chat).status_code
    if kind in ("chat_stream", "disconnect_stream"):
        with client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
            for _ in r.iter_lines():
                if kind == "disconnect_stream":
                    return 0                   # leave after the first event
            return r.status_code
    if kind == "chat_tools":
        return client.post("/v1/chat/completions", json={**chat, "tools": TOOLS}).status_code
    if kind == "chat_schema":
        fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
        return client.post("/v1/chat/completions",
                           json={**chat, "response_format": fmt}).status_code
    if kind in ("completion", "completion_stream"):
        body = {"model": MODEL, "prompt": rng.choice(USERS), "max_tokens": 8,
                "stream": kind == "completion_stream"}
        return client.post("/v1/completions", json=body).status_code
    if kind == "ollama_chat":
        body = {"model": MODEL, "messages": _messages(rng), "stream": rng.random() < 0.5,
                "options": {"num_predict": 6}}
        return client.post("/api/chat", json=body).status_code
    if kind == "embeddings":
        n = rng.choice((1, 1, 2, 8))
        return client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2",
                                                   "input": rng.sample(USERS, n)}).status_code
    if kind == "rerank":
        return client.post("/v1/rerank", json={"model": RERANK, "query": rng.choice(USERS),
                                               "documents": DOCS}).status_code
    if kind == "transcription":
        return client.post("/v1/audio/transcriptions", data={"model": ASR},
                           files={"file": ("a.wav", audio, "audio/wav")}).status_code
    if kind == "disconnect_timeout":
        try:
            return client.post("/v1/chat/completions", json={**chat, "max_tokens": 16},
                               timeout=rng.choice((0.005, 0.02, 0.05))).status_code
        except httpx.TimeoutException:
            return 0
    raise ValueError(kind)


def scrape(client) -> dict[str, float]:
    """The soak's figures from /metrics (what an operator's Prometheus would see)."""
    from prometheus_client.parser import text_string_to_metric_families
    want = {"process_resident_memory_bytes": "rss", "process_open_fds": "fds",
            "xdna_process_threads": "threads", "xdna_device_allocated_bytes": "device_bytes",
            "xdna_device_live_buffers": "device_buffers", "xdna_host_cache_bytes": "host_caches",
            "xdna_device_retained_freed_bytes": "retained_freed_bytes",
            "xdna_malloc_in_use_bytes": "malloc_in_use"}
    text = client.get("/metrics").text
    return {want[s.name]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name in want}


def slope_per_1000(points: list[tuple[int, float]]) -> float:
    """Least-squares growth of a figure per 1,000 requests."""
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 0.0 if var == 0 else 1000 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var


# --- the run -----------------------------------------------------------------------------------
def soak(requests: int = 20000, minutes: float | None = None, max_batch: int = 4,
         clients: int = 4, warmup: int | None = None, sample_every: int = 250,
         max_growth_mb: float = 5.0, seed: int = 0, models: dict[str, Path] | None = None,
         log=print, kinds: list[str] | None = None) -> dict:
    """Run the soak; `kinds` narrows the mix to those request kinds (to bisect a growth)."""
    import httpx
    from torch_xdna.runtime.settings import bound_native_caches
    bound_native_caches()            # as `xdna serve` does, before the models run any op
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    tmp = None
    if models is None:
        tmp = tempfile.TemporaryDirectory(prefix="xdna-soak-")
        models = build_models(Path(tmp.name))
    warmup = warmup if warmup is not None else min(1000, max(100, requests // 10))
    reg = ModelRegistry(max_models=4)
    reg.add_default_embedding()
    for name, path in models.items():
        reg.add_dir(path, name)
    app = create_app(ServerConfig(default_model=False, max_batch=max_batch, max_queue=256),
                     registry=reg)
    unknown = set(kinds or ()) - set(MIX)
    if unknown:
        raise ValueError(f"unknown request kinds {sorted(unknown)}; known: {sorted(MIX)}")
    kinds = [k for k in MIX if not kinds or k in kinds]
    weights = [MIX[k] for k in kinds]
    audio = wav_bytes()
    lock = threading.Lock()
    state = {"sent": 0, "statuses": {}, "by_kind": {}, "errors": []}
    samples: list[dict] = []
    try:
        with BackgroundServer(app) as srv, httpx.Client(base_url=srv.url, timeout=300) as probe:
            t0 = time.monotonic()

            def worker(i: int, upto: int, deadline: float | None) -> None:
                rng = random.Random(seed * 1000 + i + 100 * upto)
                with httpx.Client(base_url=srv.url, timeout=300) as client:
                    while True:
                        with lock:
                            if state["sent"] >= upto or (deadline and time.monotonic() > deadline):
                                return
                            state["sent"] += 1
                        kind = rng.choices(kinds, weights)[0]
                        try:
                            status = one_request(client, kind, rng, audio)
                        except Exception as e:              # noqa: BLE001 - a finding, counted
                            status = -1
                            with lock:
                                state["errors"].append(f"{kind}: {type(e).__name__}: {e}"[:200])
                        with lock:
                            state["statuses"][status] = state["statuses"].get(status, 0) + 1
                            k = state["by_kind"].setdefault(kind, {})
                            k[status] = k.get(status, 0) + 1

            def phase(upto: int, deadline: float | None) -> None:
                threads = [threading.Thread(target=worker, args=(i, upto, deadline))
                           for i in range(clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                _settle(srv)

            phase(warmup, None)               # programs built, caches and arenas filled
            idle = {**scrape(probe), "requests": state["sent"], "t_s": 0.0,
                    "rss_trimmed": _trimmed(probe)}
            idle_mem = probe.get("/debug/memory", params={"top": 100}).json()
            samples.append(idle)
            deadline = time.monotonic() + minutes * 60 if minutes else None
            while state["sent"] < requests and not (deadline and time.monotonic() > deadline):
                phase(min(requests, state["sent"] + sample_every), deadline)
                fig = {**scrape(probe), "requests": state["sent"],
                       "t_s": round(time.monotonic() - t0, 1), "rss_trimmed": _trimmed(probe)}
                samples.append(fig)             # quiescent: nothing in flight, settled
                if len(samples) % 4 == 0:
                    log(f"  {fig['requests']} requests, {fig['t_s']:.0f} s, RSS "
                        f"{fig['rss'] / 2**20:.1f} MB")
            wall = time.monotonic() - t0
            end = samples[-1]
            memory = probe.get("/debug/memory", params={"top": 100}).json()
    finally:
        if tmp is not None:
            tmp.cleanup()
    return _verdict(state, samples, idle, end, idle_mem, memory, max_growth_mb, max_batch,
                    clients, wall)


def _trimmed(probe) -> float:
    """RSS after glibc returns its free heap pages (malloc_trim; the server runs in this
    process): what is live, without the allocator's retained free memory. 0 off glibc."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return 0.0
    return scrape(probe)["rss"]


def _settle(srv, timeout: float = 30.0) -> None:
    """Wait until the device queue is empty and no batch is decoding (abandoned requests end)."""
    s = srv.app.state.server
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if s.worker.depth == 0 and not s.worker.busy:
            time.sleep(0.5)
            if s.worker.depth == 0 and not s.worker.busy:
                return
        time.sleep(0.1)


def _by_origin(memory: dict, bounded: bool) -> dict[str, float]:
    """Live device bytes by origin: the bounded workspace LRUs (an embedder keeps at most
    MAX_WORKSPACES shapes, which ones depends on how requests merged) or everything else."""
    return {o["origin"]: o["bytes"] for o in memory["device"]["by_origin"]
            if any(b in o["origin"] for b in BOUNDED) == bounded}


BOUNDED = ("Embedder._workspace",)


def _verdict(state, samples, idle, end, idle_mem, memory, max_growth_mb, max_batch, clients,
             wall) -> dict:
    """Pass or fail, with the figures: growth per 1,000 requests after warm-up (least squares
    over the samples), end against the idle figure taken after warm-up (nothing in flight)."""
    samples.sort(key=lambda s: s["requests"])
    after = samples
    warmup = idle["requests"]
    growth = {k: slope_per_1000([(s["requests"], s[k]) for s in after]) for k in
              ("rss", "rss_trimmed", "malloc_in_use", "host_caches", "fds", "threads")}
    fails = []
    for k, what in (("rss", "RSS"), ("rss_trimmed", "RSS after malloc_trim")):
        if growth[k] / 2**20 > max_growth_mb:      # raw is noisy; trimmed is what stays live
            fails.append(f"{what} grows {growth[k] / 2**20:.2f} MB per 1,000 requests after "
                         f"warm-up (limit {max_growth_mb} MB)")
    fixed_idle, fixed_end = _by_origin(idle_mem, False), _by_origin(memory, False)
    if fixed_end != fixed_idle:
        diff = {o: (fixed_idle.get(o, 0), fixed_end.get(o, 0))
                for o in set(fixed_idle) | set(fixed_end) if fixed_idle.get(o) != fixed_end.get(o)}
        fails.append(f"live device bytes by origin changed from the idle figure: {diff}")
    if end["retained_freed_bytes"]:
        fails.append(f"{end['retained_freed_bytes']:.0f} bytes of freed device buffers are "
                     f"still referenced")
    for k, slack in (("fds", 8), ("threads", 8)):
        if end[k] - idle[k] > slack:
            fails.append(f"{k} {end[k]:.0f} at the end, {idle[k]:.0f} after warm-up")
    bad = {s: n for s, n in state["statuses"].items() if s == -1 or s >= 500}
    if bad:
        fails.append(f"responses {bad}: {state['errors'][:3]}")
    sent = sum(state["statuses"].values())
    return {"ok": not fails, "failures": fails, "requests": sent, "wall_s": round(wall, 1),
            "max_batch": max_batch, "clients": clients, "warmup_requests": warmup,
            "rss_growth_mb_per_1000": round(growth["rss"] / 2**20, 3),
            "rss_trimmed_growth_mb_per_1000": round(growth["rss_trimmed"] / 2**20, 3),
            "malloc_in_use_growth_mb_per_1000": round(growth["malloc_in_use"] / 2**20, 3),
            "host_cache_growth_mb_per_1000": round(growth["host_caches"] / 2**20, 3),
            "fds_growth_per_1000": round(growth["fds"], 2),
            "threads_growth_per_1000": round(growth["threads"], 2),
            "rss_mb": {"after_warmup": round(idle["rss"] / 2**20, 1),
                       "end": round(end["rss"] / 2**20, 1)},
            "device_bytes": {"idle": idle["device_bytes"], "end": end["device_bytes"]},
            "device_buffers": {"idle": idle["device_buffers"], "end": end["device_buffers"]},
            "device_bytes_fixed": {"idle": sum(fixed_idle.values()),
                                   "end": sum(fixed_end.values())},
            "device_bytes_workspace_lru": {"idle": sum(_by_origin(idle_mem, True).values()),
                                           "end": sum(_by_origin(memory, True).values())},
            "open_fds": {"idle": idle["fds"], "end": end["fds"]},
            "threads": {"idle": idle["threads"], "end": end["threads"]},
            "statuses": {str(k): v for k, v in sorted(state["statuses"].items())},
            "by_kind": {k: {str(s): n for s, n in v.items()} for k, v in state["by_kind"].items()},
            "largest_device_origins": memory["device"]["by_origin"][:5],
            "samples": [{k: s.get(k, 0) for k in ("requests", "t_s", "rss", "rss_trimmed",
                                                  "malloc_in_use", "device_bytes")}
                        for s in samples],
            "measured": "on this host (simulated NPU)"}


def run(quick: bool = True) -> dict:
    """`xdna bench soak`: 400 requests (quick) or 20,000 (--full), default batch."""
    return soak(requests=400 if quick else 20000, sample_every=50 if quick else 250,
                max_growth_mb=50.0 if quick else 5.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--minutes", type=float, default=None, help="stop after T minutes")
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--sample-every", type=int, default=250)
    ap.add_argument("--max-growth-mb", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", default=None,
                    help="comma-separated request kinds to send (default: the whole mix)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the JSON result here")
    a = ap.parse_args()
    res = soak(a.requests, a.minutes, a.max_batch, a.clients, a.warmup, a.sample_every,
               a.max_growth_mb, a.seed, log=(lambda *x: None) if a.json else print,
               kinds=a.kinds.split(",") if a.kinds else None)
    text = json.dumps(res, indent=2)
    if a.out:
        Path(a.out).write_text(text)
    print(text if a.json else json.dumps({k: v for k, v in res.items() if k != "samples"},
                                         indent=2))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
