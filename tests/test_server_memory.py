"""A server that runs for weeks: batched chats leave nothing behind (issue #32's leak: the
simulator's KV mirror held every closed batch session's freed KV buffers and their fp32 copies,
~200 KB per chat), the device ledger names who holds memory, /metrics and /debug/memory show it."""
from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from test_server_batching import MODEL, live  # noqa: F401 - the batched server fixture
from torch_xdna.kernels.blocks.operands import KV_MIRROR


def _chat(url: str, i: int, stream: bool = False) -> None:
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": MODEL, "max_tokens": 6, "temperature": 0, "stream": stream,
        "messages": [{"role": "user", "content": f"hello number {i}"}]})
    assert r.status_code == 200, r.text


def _round(url: str, start: int, n: int = 8) -> None:
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda i: _chat(url, i, stream=i % 2 == 1), range(start, start + n)))


def _figures(srv) -> tuple[int, int, int, int]:
    gc.collect()
    rep = srv.dev.memory_report()
    live_mirrors = sum(1 for e in KV_MIRROR.entries.values() if not e[0].expired())
    return (rep["live_buffers"], rep["live_bytes"], rep["retained_after_free"]["bytes"],
            live_mirrors)


def _settled(srv, wait_s: float = 5.0) -> tuple[int, int, int, int]:
    """The figures once the device thread is idle: the last response can reach the client
    while the thread still unwinds the batch session (its frame holds the freed buffers' views
    for a moment). A real leak stays past the wait."""
    deadline = time.monotonic() + wait_s
    while True:
        fig = _figures(srv)
        if fig[2] == 0 or time.monotonic() > deadline:
            return fig
        time.sleep(0.05)


def test_batched_chats_leave_device_buffers_and_mirrors_as_they_were(live):
    srv = live.srv
    _round(live.url, 0)                       # warm-up: model resident, programs built
    before = _figures(srv)
    assert srv.batcher.runner(MODEL, srv.registry.loaded[MODEL]).max_batch > 1   # really batched
    for r in range(3):
        _round(live.url, 100 * (r + 1))
    after = _settled(srv)
    assert after[:2] == before[:2]            # live device buffers and bytes equal
    held = srv.dev.memory_report(top=20)["retained_after_free"]
    assert after[2] == 0, held                # no freed buffer's memory is still referenced
    assert after[3] == before[3]              # KV mirrors only for caches that are alive


def test_metrics_and_debug_memory_show_live_buffers_by_origin(live):
    _chat(live.url, 7)
    text = httpx.get(live.url + "/metrics").text
    from prometheus_client.parser import text_string_to_metric_families
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    rep = live.srv.dev.memory_report()
    assert samples["xdna_device_live_buffers"] == rep["live_buffers"] > 0
    assert samples["xdna_device_allocated_bytes"] == rep["live_bytes"]
    assert samples["process_resident_memory_bytes"] > 0 and samples["process_open_fds"] > 0
    assert samples["xdna_process_threads"] >= 2 and samples["xdna_device_retained_freed_bytes"] == 0
    assert samples["xdna_malloc_in_use_bytes"] > 0       # glibc: live native heap, untrimmed
    mem = httpx.get(live.url + "/debug/memory", params={"top": 3}).json()
    assert mem["device"]["live_bytes"] == rep["live_bytes"]
    assert len(mem["device"]["largest"]) == 3
    # the allocating engine code, not the runtime (every origin: the process-wide device may
    # also hold buffers of earlier tests in the same process, e.g. compiled partitions' weights)
    every = httpx.get(live.url + "/debug/memory", params={"top": 1000}).json()
    origins = " ".join(o["origin"] for o in every["device"]["by_origin"])
    assert "engine/" in origins
    assert mem["process"]["rss_bytes"] > 0 and "sim_kv_mirror" in mem["host_caches"]
    assert mem["process"]["malloc_in_use_bytes"] > 0
    assert httpx.get(live.url + "/debug/memory", params={"top": 0}).status_code == 422


def test_ledger_reports_a_freed_buffer_kept_alive_by_a_view():
    from torch_xdna.runtime import get_device
    dev = get_device()
    gc.collect()
    base = dev.memory_report(top=10_000)
    arg = dev.empty((64, 64), __import__("torch").float32)
    kept = arg.host_view()[:8]                # a view outliving the buffer (what the mirror did)
    rep = dev.memory_report(top=10_000)
    assert rep["live_buffers"] == base["live_buffers"] + 1
    assert any("test_server_memory.py" in o["origin"] for o in rep["by_origin"])
    dev.free(arg.buffer)
    held = dev.memory_report(top=10_000)["retained_after_free"]
    assert held["bytes"] == base["retained_after_free"]["bytes"] + arg.buffer.nbytes
    assert any("test_server_memory.py" in o["origin"] for o in held["by_origin"])
    del kept
    gc.collect()
    assert dev.memory_report(top=10_000)["retained_after_free"] == base["retained_after_free"]
