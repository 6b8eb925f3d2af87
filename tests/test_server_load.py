"""Bounded load test on loopback (issue 15): 2,000 idle and partial-header sockets against a real
uvicorn server while normal clients keep calling /health and /v1/embeddings. Before the HTTP
limits, ~20,000 such sockets made /health stop answering; now the connection cap evicts the
longest-idle sockets, the header timeout closes the rest, and every real request is answered.
Host wall times here are measured on this host; it stops by itself in well under 60 s."""
from __future__ import annotations

import socket
import statistics
import threading
import time

import httpx
import pytest
import torch

from torch_xdna.engine.embed.embedder import Embedder
from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.http import HttpLimits, raise_nofile_limit
from torch_xdna.server.registry import ModelRegistry

N_SOCKETS = 2000
TRAFFIC_S = 8.0
HEADER_TIMEOUT_S = 4.0


def test_idle_and_partial_header_sockets_do_not_starve_real_clients():
    if raise_nofile_limit() < N_SOCKETS + 1500:
        pytest.skip("the open-file limit is too low for 2,000 client sockets + the server's")
    emb = Embedder.load()
    want = emb.embed(["hello world"])[0]
    reg = ModelRegistry()
    reg.add_object(emb, "embedding", "all-MiniLM-L6-v2")
    limits = HttpLimits(header_timeout_s=HEADER_TIMEOUT_S, max_connections=1024)
    app = create_app(ServerConfig(preload=False, limits=limits), registry=reg)
    with BackgroundServer(app) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        addr = (host, int(port))
        pool = srv.server.config.http_protocol_class.connection_pool
        stop = threading.Event()
        lat: dict[str, list[float]] = {"/health": [], "/v1/embeddings": []}
        failures: list[str] = []

        def traffic(fresh: bool) -> None:
            client = httpx.Client(base_url=srv.url, timeout=10)
            try:
                while not stop.is_set():
                    for route in lat:
                        t0 = time.perf_counter()
                        try:
                            if route == "/health":
                                r = (httpx.get(srv.url + route, timeout=10) if fresh
                                     else client.get(route))
                                ok = r.status_code == 200 and r.json()["status"] == "ok"
                            else:
                                r = client.post(route, json={"input": "hello world"})
                                ok = r.status_code == 200 and torch.equal(
                                    torch.tensor(r.json()["data"][0]["embedding"]), want)
                        except httpx.HTTPError as e:
                            failures.append(f"{route}: {type(e).__name__}: {e}")
                            continue
                        lat[route].append(time.perf_counter() - t0)
                        if not ok:
                            failures.append(f"{route}: {r.status_code} {r.text[:120]}")
            finally:
                client.close()

        clients = [threading.Thread(target=traffic, args=(fresh,)) for fresh in (False, True)]
        for t in clients:
            t.start()
        t_start = time.monotonic()
        socks: list[socket.socket] = []
        try:
            for i in range(N_SOCKETS):                 # half say nothing, half stall mid-headers
                s = socket.create_connection(addr, timeout=5)
                if i % 2:
                    s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Le")
                socks.append(s)
            opened_s = time.monotonic() - t_start
            time.sleep(max(0.0, TRAFFIC_S - (time.monotonic() - t_start)))
            stop.set()
            for t in clients:
                t.join(20)
            # the header timeout has closed every socket that survived eviction
            deadline = time.monotonic() + HEADER_TIMEOUT_S + 5
            while pool.open > 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            open_after = pool.open
            closed = 0
            for s in socks:
                s.settimeout(0.01)
                try:
                    data = s.recv(4096)
                    closed += data == b"" or data.startswith(b"HTTP/1.1 408")
                except (socket.timeout, BlockingIOError):
                    pass
                except ConnectionResetError:
                    closed += 1
        finally:
            stop.set()
            for s in socks:
                s.close()
        assert httpx.get(srv.url + "/health", timeout=5).status_code == 200

    h, e = sorted(lat["/health"]), sorted(lat["/v1/embeddings"])
    peak_open = pool.peak
    summary = (f"{N_SOCKETS} sockets opened in {opened_s:.1f} s (at most {peak_open} open server-side, "
               f"cap {pool.cap}); {pool.evicted} evicted, {pool.header_timeouts} header timeouts, "
               f"{pool.refused} refused; {closed}/{N_SOCKETS} closed by the server, {open_after} "
               f"open after; /health {len(h)} ok, p50 {statistics.median(h) * 1e3:.1f} ms, max "
               f"{h[-1] * 1e3:.0f} ms; /v1/embeddings {len(e)} ok, p50 "
               f"{statistics.median(e) * 1e3:.1f} ms, max {e[-1] * 1e3:.0f} ms (measured on this "
               f"host)")
    print(summary)
    assert not failures, failures[:5]
    assert len(h) >= 20 and len(e) >= 10, summary
    assert h[-1] < 5.0 and e[-1] < 5.0, summary
    assert peak_open <= pool.cap and open_after <= 2, summary
    assert pool.evicted >= N_SOCKETS - pool.cap and closed == N_SOCKETS, summary
