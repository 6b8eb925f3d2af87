"""Profiler: records, tables that sum, a valid Chrome trace-event file, fallbacks, and the CLI."""
from __future__ import annotations

import json

import pytest
import torch

from torch_xdna.hw import NPU4
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.runtime import Launch, Program
from torch_xdna.runtime import profiler
from torch_xdna.runtime.sim import SimDevice

F32 = torch.float32


@pytest.fixture
def dev():
    return SimDevice(NPU4, 1 << 28)


def _workload(dev):
    x = dev.upload(torch.randn(16, 32))
    w = dev.upload(torch.randn(32, 64))
    h = dev.empty((16, 64), F32)
    y = dev.empty((16, 64), F32)
    mm = Launch(GemmDesign(16, 32, 64), [x, w], [h], op="linear")
    act = Launch(VectorDesign("silu", ((16, 64),), (F32,), (16, 64), F32), [h], [y], op="silu")
    dev.run(mm)
    dev.run(act)
    dev.run_program(Program([mm, act, mm], name="block"))
    return h


def test_records_table_and_summary_sum(dev):
    with profiler.profile(dev) as prof:
        _workload(dev)
    assert dev.trace is None                              # restored after the block
    assert len(prof.records) == 5
    total = sum(r.modeled_us for r in prof.records)
    assert prof.total_us == pytest.approx(total)
    rows = prof.table()
    designs = [r for r in rows if r["kind"] == "design"]
    ops = [r for r in rows if r["kind"] == "op"]
    assert {r["name"] for r in designs} == {"gemm[bf16]", "silu"}
    assert {r["name"]: r["count"] for r in ops} == {"linear": 3, "silu": 2}
    for group in (designs, ops):
        assert sum(r["modeled_us"] for r in group) == pytest.approx(total)
        assert sum(r["share"] for r in group) == pytest.approx(1.0)
        assert sum(r["bytes"] for r in group) == sum(r.bytes_in + r.bytes_out for r in prof.records)
    s = prof.summary()
    assert s["time"] == "modeled (simulator)" and s["launches"] == 5
    assert s["dispatches"] == 3 and s["programs"] == 1
    assert s["total_us"] == pytest.approx(sum(s["terms_us"].values()))
    assert s["total_us"] == pytest.approx(dev.counters.modeled_us - _flush_us(dev), rel=1e-6)
    text = prof.format_table()
    assert "modeled (simulator)" in text and "linear" in text and "gemm[bf16]" in text


def _flush_us(dev):
    """Cache-flush time the device charged for syncs (outside launches)."""
    return dev.counters.bytes_to_device / 1e6 * NPU4.flush_us_per_mb.value


def test_chrome_trace_is_valid_trace_event_json(dev, tmp_path):
    with profiler.profile(dev) as prof:
        _workload(dev)
    path = prof.export_chrome_trace(tmp_path / "sub" / "trace.json")
    data = json.loads(open(path).read())
    events = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(events) == 5
    for e in events:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
        assert e["args"]["design"] and "terms_us" in e["args"]
    ts = [e["ts"] for e in events]
    assert ts == sorted(ts)                                # a timeline, launches in order
    for a, b in zip(events, events[1:]):
        assert b["ts"] >= a["ts"] + a["dur"] - 1e-3        # no overlap on one device lane
    assert data["otherData"]["time"] == "modeled (simulator)"


def test_fallbacks_from_hook_and_snapshot(dev):
    counts = {"aten.foo": 2}
    profiler.register_fallback_counter(lambda: dict(counts))
    try:
        with profiler.profile(dev) as prof:
            _workload(dev)
            counts["aten.foo"] = 5
            counts["aten.bar"] = 1
        assert prof.fallbacks == {"aten.foo": 3, "aten.bar": 1}
        rows = {r["name"]: r for r in prof.table() if r["kind"] == "op"}
        assert rows["aten.foo"]["fallbacks"] == 3 and rows["aten.foo"]["count"] == 0
        assert prof.summary()["host_fallbacks"] == 4
        # an explicit snapshot replaces the hook's delta
        rows = {r["name"]: r for r in prof.table({"aten.baz": 7}) if r["kind"] == "op"}
        assert rows["aten.baz"]["fallbacks"] == 7 and "aten.foo" not in rows
    finally:
        profiler.register_fallback_counter(None)
    assert profiler.fallback_counts() == {}


def test_nested_profiles_keep_the_outer_trace(dev):
    with profiler.profile(dev) as outer:
        _workload(dev)
        with profiler.profile(dev) as inner:
            _workload(dev)
        assert dev.trace is not None
    assert len(inner.records) == 5 and len(outer.records) == 10


def test_cli_profile(tmp_path, capsys):
    from torch_xdna.cli.npu import profile as cli_profile
    from torch_xdna.runtime import set_device_for_testing
    prev = set_device_for_testing(SimDevice(NPU4, 1 << 28))
    try:
        import argparse
        parser = argparse.ArgumentParser()
        cli_profile.register(parser.add_subparsers())
        trace = tmp_path / "t.json"
        args = parser.parse_args(["profile", "--shape", "8", "64", "128", "--trace", str(trace)])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert "modeled (simulator)" in out and "mlp.up 8x64x128" in out
        assert json.loads(trace.read_text())["traceEvents"]
        args = parser.parse_args(["profile", "--shape", "8", "64", "128", "--json"])
        assert args.func(args) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["summary"]["launches"] == 4 and data["summary"]["time"] == "modeled (simulator)"
    finally:
        set_device_for_testing(prev)


def test_fallback_trace_records_are_counted_not_timed(dev):
    from torch_xdna.runtime import TraceRecord
    with profiler.profile(dev) as prof:
        _workload(dev)
        dev.trace.append(TraceRecord(design="host", op="aten.sort", plan="", bytes_in=0,
                                     bytes_out=0, terms={}, modeled_us=0.0, start_us=0.0,
                                     host_us=12.5, fallback=True))
    assert len(prof.records) == 6 and len(prof.npu_records) == 5
    rows = {r["name"]: r for r in prof.table() if r["kind"] == "op"}
    assert rows["aten.sort"]["fallbacks"] == 1 and rows["aten.sort"]["count"] == 0
    s = prof.summary()
    assert s["launches"] == 5 and s["host_fallbacks"] == 1 and s["host_fallback_us"] == 12.5
    assert sum(r["modeled_us"] for r in prof.table() if r["kind"] == "op") == pytest.approx(
        prof.total_us)
    events = prof.chrome_trace()["traceEvents"]
    assert any(e.get("cat") == "fallback" for e in events)
