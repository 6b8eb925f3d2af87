"""The server's /metrics, through prometheus-client (one registry per server, so several servers
in one process, as in the tests, keep separate figures).

NPU time is labeled `modeled` because on the simulator it comes from the cost model, not a clock.
Process figures (resident memory, open files, CPU) come from prometheus-client's process
collector, plus the thread count; device memory gauges are added by the server (state.py).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def process_threads() -> int:
    """OS threads of this process (the kernel's count: Python, torch and uvicorn threads)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[17])
    except (OSError, IndexError, ValueError):
        return threading.active_count()


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]


def native_heap() -> dict[str, int]:
    """glibc's heap, all arenas (mallinfo2): bytes handed out by malloc (C, C++ and Rust
    libraries, torch tensors, Python's large objects and pymalloc arenas) and bytes it holds
    free. It tells live native growth (in use rises) from fragmentation (free rises, RSS with
    it); {} off glibc."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _Mallinfo2
    m = fn()
    return {"malloc_in_use_bytes": m.uordblks + m.hblkhd, "malloc_free_bytes": m.fordblks,
            "malloc_mmapped_bytes": m.hblkhd}


def process_stats() -> dict[str, int]:
    """Resident memory, OS threads and open file descriptors of this process (Linux /proc)."""
    import os
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        rss = 0
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = 0
    return {"rss_bytes": rss, "threads": process_threads(), "open_fds": fds, **native_heap()}


class Metrics:
    """Counters, latency histograms and gauges; `render()` gives the /metrics body."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self._gauges: dict[str, Gauge] = {}
        ProcessCollector(registry=r)
        self._requests = Counter("xdna_requests", "HTTP requests by method, route and status",
                                 ["method", "route", "status"], registry=r)
        self._latency = Histogram("xdna_request_duration_seconds",
                                  "HTTP request latency (measured wall time, to the last byte)",
                                  ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self._tokens = Counter("xdna_tokens", "tokens processed by model and kind",
                               ["model", "kind"], registry=r)
        self._embeddings = Counter("xdna_embeddings", "embedding vectors returned", ["model"],
                                   registry=r)
        self._dispatches = Counter("xdna_npu_dispatches", "NPU command submissions", registry=r)
        self._modeled = Counter("xdna_npu_modeled_seconds",
                                "NPU busy time from the simulator's cost model (modeled, not "
                                "measured)", registry=r)
        self._rejected = Counter("xdna_rejected", "requests refused before reaching the NPU",
                                 ["reason"], registry=r)
        self.gauge("xdna_process_threads", "OS threads of the server process", process_threads)
        self.gauge("xdna_malloc_in_use_bytes", "bytes malloc has handed out and not had back "
                   "(glibc, all arenas: native libraries, tensors, Python's heap)",
                   lambda: native_heap().get("malloc_in_use_bytes", 0))

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._requests.labels(method, route, str(status)).inc()
        self._latency.labels(route).observe(seconds)

    def add_tokens(self, model: str, kind: str, n: int) -> None:
        self._tokens.labels(model, kind).inc(n)

    def add_npu(self, dispatches: int, modeled_us: float) -> None:
        self._dispatches.inc(dispatches)
        self._modeled.inc(modeled_us / 1e6)

    def add_embeddings(self, model: str, n: int) -> None:
        self._embeddings.labels(model).inc(n)

    def reject(self, reason: str) -> None:
        self._rejected.labels(reason).inc()

    def gauge(self, name: str, help: str, fn: Callable[[], float]) -> None:
        """A gauge read when /metrics is scraped (registering a name again replaces it)."""
        old = self._gauges.pop(name, None)
        if old is not None:
            self.registry.unregister(old)
        self._gauges[name] = g = Gauge(name, help, registry=self.registry)
        g.set_function(fn)

    def render(self) -> str:
        return generate_latest(self.registry).decode()
