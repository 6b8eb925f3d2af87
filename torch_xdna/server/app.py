"""The OpenAI-compatible HTTP API: create_app(config) -> FastAPI app. This module only assembles:
state (state.py), error handlers (errors.py), the endpoint families (routes/), the guard
(guard.py).

Request path: ASGI guard (auth, body limit, metrics) -> parse + validate (400 in OpenAI's error
shape) -> tokenize on a thread pool -> ONE device worker queue (429 when full) -> engine -> JSON or
SSE. Everything that can be rejected is rejected before the request takes a place on the NPU.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from torch_xdna.server.config import ServerConfig
from torch_xdna.server.errors import install_error_handlers
from torch_xdna.server.guard import install_guard
from torch_xdna.server.registry import ModelRegistry
from torch_xdna.server.routes import (anthropic, audio, embeddings, health, models, ollama,
                                     openai_chat, rerank, responses, ui)
from torch_xdna.server.state import Server, backend_description

log = logging.getLogger("torch_xdna.server")

# The API surfaces, one module each under server/routes/, each exposing `register(app, srv)`;
# registered in this order.
ROUTE_MODULES = (health, models, embeddings, openai_chat, ollama, rerank, audio, anthropic,
                 responses, ui)


def create_app(config: ServerConfig | None = None, registry: ModelRegistry | None = None) -> FastAPI:
    config = config or ServerConfig()
    srv = Server(config, registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        srv.worker.start()
        if config.preload and not srv.preloaded:     # `xdna serve` preloads before uvicorn
            await asyncio.wrap_future(srv.worker.call(srv.npu_job(srv.preload)))
        entries = ", ".join(f"{e.id} ({e.kind})" for e in srv.registry.entries.values())
        log.info("torch-xdna server ready on %s  backend: %s  models: %s", config.url(),
                 backend_description(srv.dev), entries)
        try:
            yield
        finally:
            await run_in_threadpool(srv.worker.stop)
            await run_in_threadpool(srv.registry.close_all)

    app = FastAPI(title="torch-xdna", version="0.1.0", lifespan=lifespan)
    app.state.server = srv
    install_error_handlers(app)
    for module in ROUTE_MODULES:
        module.register(app, srv)
    install_guard(app, config, srv)
    return app
