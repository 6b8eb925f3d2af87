"""What the server is doing, for operators and load balancers: /health (backend, models, queue)
and /metrics (Prometheus text)."""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from torch_xdna.server.state import Server, backend_description


def register(app: FastAPI, srv: Server) -> None:
    """Add /health and /metrics to `app`."""

    @app.get("/health")
    async def health():
        return {"status": "ok", "backend": srv.dev.backend,
                "backend_description": backend_description(srv.dev),
                "generation": srv.dev.gen.name,
                "models": list(srv.registry.entries), "resident": srv.registry.loaded_ids(),
                "queue_depth": srv.worker.depth, "max_queue": srv.config.max_queue}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(srv.metrics.render(), media_type="text/plain; version=0.0.4")
