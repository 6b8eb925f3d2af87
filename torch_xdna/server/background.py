"""Run a server app in a background thread on a free loopback port (tests, benchmarks)."""
from __future__ import annotations

import threading
import time


class BackgroundServer:
    """`with BackgroundServer(app) as s: httpx.get(s.url + "/health")` — uvicorn in a thread;
    port 0 lets the OS pick a free port; leaving the block stops the server."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 120.0):
        from torch_xdna.server.http import HttpLimits, XdnaServer, uvicorn_config
        self.app, self.start_timeout = app, start_timeout
        srv = getattr(app.state, "server", None)
        limits = srv.config.limits if srv is not None else HttpLimits()
        # the same transport as `xdna serve`: limits, timeouts, graceful shutdown
        self.server = XdnaServer(uvicorn_config(app, host, port, limits, log_level="warning",
                                                lifespan="on"), limits.graceful_timeout_s)
        self.thread = threading.Thread(target=self.server.run, name="xdna-uvicorn", daemon=True)
        self.url = ""

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during startup (see its log)")
            if time.monotonic() > deadline:
                self.server.should_exit = True
                raise RuntimeError(f"the server did not start within {self.start_timeout} s")
            time.sleep(0.05)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        if self.thread.is_alive():
            raise RuntimeError("the server thread did not stop within 30 s")
