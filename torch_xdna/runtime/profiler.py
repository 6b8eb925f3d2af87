"""Profiler: where the (modeled) NPU time goes, per design and per op, and a Chrome trace.

    with profile() as prof:
        ...                                  # launches on the device
    print(prof.format_table())
    prof.export_chrome_trace("trace.json")   # open in chrome://tracing or ui.perfetto.dev

While active, the device fills `Device.trace` with one TraceRecord per launch. On the simulator
every time is modeled by the cost model, and every output says so. Host fallbacks (ops run on the
CPU because no NPU design exists) come from a hook the torch device layer registers with
`register_fallback_counter`, or from a snapshot dict passed to `table()`.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from torch_xdna.runtime.device import Device, TraceRecord

_fallback_counter: Callable[[], dict] | None = None


def register_fallback_counter(fn: Callable[[], dict] | None) -> None:
    """The device layer registers `fallback_counts() -> {op name: count}` (monotonic)."""
    global _fallback_counter
    _fallback_counter = fn


def fallback_counts() -> dict:
    """Current host-fallback counts per op ({} when no device layer registered a counter)."""
    if _fallback_counter is None:
        return {}
    try:
        return dict(_fallback_counter())
    except Exception:                      # a broken hook must not break profiling
        return {}


def _delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0) if isinstance(v, (int, float)) else v
        if d:
            out[k] = d
    return out


def time_label(backend: str) -> str:
    return "modeled (simulator)" if backend == "sim" else f"measured ({backend})"


@dataclass
class Profile:
    """Records collected by `profile()`, with tables, a summary and a Chrome trace export."""

    backend: str = "sim"
    records: list[TraceRecord] = field(default_factory=list)
    counters: dict = field(default_factory=dict)       # device counter deltas over the profile
    fallbacks: dict = field(default_factory=dict)      # host fallbacks per op over the profile

    @property
    def label(self) -> str:
        return time_label(self.backend)

    @property
    def npu_records(self) -> list[TraceRecord]:
        """Launches that ran on the NPU (host-fallback records excluded)."""
        return [r for r in self.records if not r.fallback]

    @property
    def total_us(self) -> float:
        return sum(r.modeled_us for r in self.npu_records)

    def _fallbacks(self, override: dict | None = None) -> dict:
        fb = dict(self.fallbacks if override is None else override)
        for r in self.records:
            if r.fallback:
                fb[r.op] = fb.get(r.op, 0) + 1
        return fb

    def table(self, fallbacks: dict | None = None) -> list[dict]:
        """Rows per design (kind="design") then per op (kind="op"), biggest first: count,
        modeled_us, bytes moved, share of the total, host fallbacks (ops only)."""
        fb = self._fallbacks(fallbacks)
        total = self.total_us
        rows: list[dict] = []
        for kind, key in (("design", lambda r: r.design), ("op", lambda r: r.op)):
            groups: dict[str, dict] = {}
            for r in self.npu_records:
                g = groups.setdefault(key(r), {"kind": kind, "name": key(r), "count": 0,
                                               "modeled_us": 0.0, "bytes": 0})
                g["count"] += 1
                g["modeled_us"] += r.modeled_us
                g["bytes"] += r.bytes_in + r.bytes_out
            if kind == "op":
                for op, n in fb.items():
                    groups.setdefault(op, {"kind": kind, "name": op, "count": 0,
                                           "modeled_us": 0.0, "bytes": 0})
            for g in groups.values():
                g["share"] = g["modeled_us"] / total if total > 0 else 0.0
                g["fallbacks"] = fb.get(g["name"], 0) if kind == "op" else 0
            rows += sorted(groups.values(), key=lambda g: (-g["modeled_us"], g["name"]))
        return rows

    def summary(self) -> dict:
        terms: dict[str, float] = {}
        for r in self.npu_records:
            for k, v in r.terms.items():
                terms[k] = terms.get(k, 0.0) + v
        fb = self._fallbacks()
        return {
            "time": self.label, "backend": self.backend,
            "launches": len(self.npu_records),
            "dispatches": self.counters.get("dispatches", 0),
            "programs": self.counters.get("programs", 0),
            "reconfigurations": self.counters.get("reconfigurations", 0),
            "context_switches": self.counters.get("context_switches", 0),
            "total_us": self.total_us,
            "bytes": sum(r.bytes_in + r.bytes_out for r in self.npu_records),
            "host_fallbacks": sum(fb.values()),
            "host_fallback_us": sum(r.host_us for r in self.records if r.fallback),
            "terms_us": terms,
            "designs": len({r.design for r in self.npu_records}),
        }

    def format_table(self, limit: int = 30) -> str:
        """A readable text table (per design, then per op)."""
        lines = [f"NPU time, {self.label}: {self.total_us:.1f} us over "
                 f"{len(self.npu_records)} launches"]
        header = f"{'name':<36} {'count':>6} {'us':>12} {'share':>7} {'MB moved':>10} {'fallbacks':>9}"
        rows = self.table()
        for kind, title in (("design", "per design"), ("op", "per op")):
            lines += ["", f"{title} ({self.label})", header, "-" * len(header)]
            for row in [r for r in rows if r["kind"] == kind][:limit]:
                lines.append(f"{row['name'][:36]:<36} {row['count']:>6} {row['modeled_us']:>12.1f} "
                             f"{row['share']:>6.1%} {row['bytes'] / 1e6:>10.3f} "
                             f"{row['fallbacks'] if kind == 'op' else '':>9}")
        s = self.summary()
        lines += ["", "terms (us): " + ", ".join(f"{k}={v:.1f}" for k, v in s["terms_us"].items()
                                                  if v),
                  f"dispatches={s['dispatches']} reconfigurations={s['reconfigurations']} "
                  f"context_switches={s['context_switches']} host_fallbacks={s['host_fallbacks']}"]
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        """Trace-event JSON (Chrome tracing / Perfetto): one complete ('X') event per launch."""
        events: list[dict] = [
            {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
             "args": {"name": f"XDNA NPU ({self.label})"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "launches"}},
        ]
        host_ts = 0.0
        for i, r in enumerate(self.records):
            ts = r.start_us if self.backend == "sim" else host_ts
            dur = r.modeled_us if self.backend == "sim" else r.host_us
            host_ts += r.host_us
            events.append({
                "name": r.op or r.design, "cat": "fallback" if r.fallback else r.design,
                "ph": "X", "ts": round(ts, 3), "dur": round(max(dur, 0.0), 3), "pid": 1,
                "tid": 1, "args": {"design": r.design, "plan": r.plan, "bytes_in": r.bytes_in,
                                   "bytes_out": r.bytes_out, "program": r.program,
                                   "host_us": round(r.host_us, 3), "fallback": r.fallback,
                                   "terms_us": {k: round(v, 3) for k, v in r.terms.items()},
                                   "index": i}})
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"time": self.label, "backend": self.backend}}

    def export_chrome_trace(self, path: str | os.PathLike) -> str:
        path = os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)
        return path

    def to_json(self) -> dict:
        return {"summary": self.summary(), "table": self.table()}


@contextmanager
def profile(device: Device | None = None, fallbacks: dict | None = None) -> Iterator[Profile]:
    """Trace every launch on `device` (default: the process device) while the block runs.

    `fallbacks`, when given, is a snapshot {op: count} taken before the block: the profile then
    reports the increase of `fallback_counts()` over it (default: a snapshot taken on entry)."""
    if device is None:
        from torch_xdna.runtime import get_device
        device = get_device()
    prof = Profile(backend=device.backend)
    before_fb = dict(fallbacks) if fallbacks is not None else fallback_counts()
    with device.lock:
        before = device.counters.snapshot()
        previous = device.trace
        if previous is None:
            device.trace = []
        start = len(device.trace)
    try:
        yield prof
    finally:
        with device.lock:
            prof.records = list(device.trace[start:])
            prof.counters = _delta(device.counters.snapshot(), before)
            if previous is None:
                device.trace = None
        prof.fallbacks = _delta(fallback_counts(), before_fb)
