"""Prometheus text-format metrics, kept in-process (no client library needed).

NPU time is labeled `modeled` because on the simulator it comes from the cost model, not a clock.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from typing import Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _labels(**kw: str) -> str:
    def esc(v: str) -> str:
        return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in kw.items()) + "}"


class Metrics:
    """Counters and latency histograms; `render()` gives the /metrics body."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.hist: dict[str, list[int]] = {}
        self.hist_sum: dict[str, float] = defaultdict(float)
        self.hist_count: dict[str, int] = defaultdict(int)
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)     # (model, kind) -> tokens
        self.embeddings: dict[str, int] = defaultdict(int)
        self.dispatches = 0
        self.modeled_npu_seconds = 0.0
        self.rejected: dict[str, int] = defaultdict(int)               # reason -> count
        self.gauges: dict[str, tuple[str, Callable[[], float]]] = {}

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(method, route, status)] += 1
            counts = self.hist.setdefault(route, [0] * len(LATENCY_BUCKETS))
            for i, b in enumerate(LATENCY_BUCKETS):
                if seconds <= b:
                    counts[i] += 1
            self.hist_sum[route] += seconds
            self.hist_count[route] += 1

    def add_tokens(self, model: str, kind: str, n: int) -> None:
        with self._lock:
            self.tokens[(model, kind)] += n

    def add_npu(self, dispatches: int, modeled_us: float) -> None:
        with self._lock:
            self.dispatches += dispatches
            self.modeled_npu_seconds += modeled_us / 1e6

    def add_embeddings(self, model: str, n: int) -> None:
        with self._lock:
            self.embeddings[model] += n

    def reject(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def gauge(self, name: str, help: str, fn: Callable[[], float]) -> None:
        self.gauges[name] = (help, fn)

    def render(self) -> str:
        out: list[str] = []

        def head(name: str, typ: str, help: str) -> None:
            out.append(f"# HELP {name} {help}")
            out.append(f"# TYPE {name} {typ}")

        with self._lock:
            head("xdna_requests_total", "counter", "HTTP requests by method, route and status")
            for (m, r, s), n in sorted(self.requests.items()):
                out.append(f"xdna_requests_total{_labels(method=m, route=r, status=str(s))} {n}")
            head("xdna_request_duration_seconds", "histogram",
                 "HTTP request latency (measured wall time, to the last byte)")
            for route, counts in sorted(self.hist.items()):
                for b, c in zip(LATENCY_BUCKETS, counts):
                    out.append(f"xdna_request_duration_seconds_bucket{_labels(route=route, le=str(b))} {c}")
                out.append(f"xdna_request_duration_seconds_bucket{_labels(route=route, le='+Inf')} "
                           f"{self.hist_count[route]}")
                out.append(f"xdna_request_duration_seconds_sum{_labels(route=route)} "
                           f"{self.hist_sum[route]:.6f}")
                out.append(f"xdna_request_duration_seconds_count{_labels(route=route)} "
                           f"{self.hist_count[route]}")
            head("xdna_tokens_total", "counter", "tokens processed by model and kind")
            for (model, kind), n in sorted(self.tokens.items()):
                out.append(f"xdna_tokens_total{_labels(model=model, kind=kind)} {n}")
            head("xdna_embeddings_total", "counter", "embedding vectors returned")
            for model, n in sorted(self.embeddings.items()):
                out.append(f"xdna_embeddings_total{_labels(model=model)} {n}")
            head("xdna_npu_dispatches_total", "counter", "NPU command submissions")
            out.append(f"xdna_npu_dispatches_total {self.dispatches}")
            head("xdna_npu_modeled_seconds_total", "counter",
                 "NPU busy time from the simulator's cost model (modeled, not measured)")
            out.append(f"xdna_npu_modeled_seconds_total {self.modeled_npu_seconds:.6f}")
            head("xdna_rejected_total", "counter", "requests refused before reaching the NPU")
            for reason, n in sorted(self.rejected.items()):
                out.append(f"xdna_rejected_total{_labels(reason=reason)} {n}")
        for name, (help, fn) in sorted(self.gauges.items()):
            head(name, "gauge", help)
            out.append(f"{name} {fn()}")
        return "\n".join(out) + "\n"
