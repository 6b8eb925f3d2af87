"""The ASGI guard around the app: refuses what must not reach a route (shutdown, a missing or
wrong API key, an over-long or trickled body) and times every request for the metrics; plus the
CORS middleware for the browser origins the user allows.

The key is read from `Authorization: Bearer KEY` (OpenAI, Ollama clients) or `x-api-key: KEY`
(Anthropic clients). A CORS preflight (OPTIONS with Access-Control-Request-Method) never needs the
key: browsers never send credentials on one. Refusals are answered in the shape of the API the
path belongs to (errors.error_json)."""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from typing import TYPE_CHECKING

from fastapi import FastAPI

from torch_xdna.server.config import ServerConfig
from torch_xdna.server.errors import error_json
from torch_xdna.server.metrics import Metrics
from torch_xdna.server.schemas import APIError

if TYPE_CHECKING:
    from torch_xdna.server.state import Server

ROUTES = ("/health", "/metrics", "/v1/models", "/v1/embeddings", "/v1/chat/completions",
          "/v1/completions", "/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
          "/api/tags", "/api/show", "/api/ps", "/api/version", "/v1/rerank", "/rerank",
          "/v1/audio/transcriptions", "/v1/audio/translations", "/v1/messages",
          "/v1/messages/count_tokens", "/v1/responses", "/", "/ui", "/debug/memory")   # metrics labels
OPEN_PATHS = ("/health", "/", "/ui")      # never need the key (the chat page asks for it)


class Guard:
    """Wraps the app: checks the API key, caps the body, times every request."""

    def __init__(self, app, config: ServerConfig, metrics: Metrics, server: "Server"):
        self.app, self.config, self.metrics, self.server = app, config, metrics, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        path = scope.get("path", "")
        route = path if path in ROUTES else ("/v1/models/{id}" if path.startswith("/v1/models/")
                                             else "other")
        status = {"code": 500}

        async def send_wrapped(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            error = None
            if self.server.shutting_down:
                error = APIError(503, "The server is shutting down; retry on another instance or "
                                      "after it restarts.", type="server_error",
                                 code="shutting_down", headers={"Connection": "close"})
            error = error or self._check_auth(scope, path)
            body = None
            if error is None and scope.get("method") in ("POST", "PUT", "PATCH"):
                body, error = await self._read_body(scope, receive, t0)
            if error is not None:
                await _send_json(send_wrapped, error, path, self._cors_origin(scope))
                return
            if body is not None:
                replayed = {"done": False}

                async def receive_replay():
                    if not replayed["done"]:
                        replayed["done"] = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    return await receive()
                await self.app(scope, receive_replay, send_wrapped)
            else:
                await self.app(scope, receive, send_wrapped)
        finally:
            self.metrics.observe_request(scope.get("method", ""), route, status["code"],
                                         time.perf_counter() - t0)

    def _cors_origin(self, scope) -> str | None:
        """The request's Origin when CORS allows it: the guard's own refusals (401, 413...) are
        answered before the CORS middleware, and a browser reads them only with this header."""
        origin = dict(scope.get("headers") or []).get(b"origin", b"").decode("latin-1")
        allowed = self.config.cors_origins
        return origin if origin and ("*" in allowed or origin in allowed) else None

    def _check_auth(self, scope, path: str) -> APIError | None:
        key = self.config.api_key
        if not key or path in OPEN_PATHS or path.startswith("/ui/"):
            return None
        headers = dict(scope.get("headers") or [])
        if scope.get("method") == "OPTIONS" and b"access-control-request-method" in headers:
            return None                   # a CORS preflight: browsers never send the key on it
        # compare bytes: ASGI hands over the raw header bytes (a UTF-8 key arrives as its UTF-8
        # bytes; decoding them as latin-1 and re-encoding as UTF-8 would never match)
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        given = given or headers.get(b"x-api-key", b"").strip()
        if not given:
            self.metrics.reject("auth")
            return APIError(401, "You didn't provide an API key. Send it as 'Authorization: "
                                 "Bearer KEY' or 'x-api-key: KEY' (the --api-key given to "
                                 "xdna serve).",
                            type="invalid_request_error", code="invalid_api_key")
        if not hmac.compare_digest(given, key.encode("utf-8")):
            self.metrics.reject("auth")
            return APIError(401, "Incorrect API key provided. Use the --api-key given to "
                                 "xdna serve.", type="invalid_request_error", code="invalid_api_key")
        return None

    async def _read_body(self, scope, receive,
                         t0: float) -> tuple[bytes | None, APIError | None]:
        limit = (self.config.max_audio_bytes if scope.get("path", "").startswith("/v1/audio/")
                 else self.config.max_body_bytes)
        too_big = APIError(413, f"Request body exceeds the server limit of {limit} bytes; "
                                f"send fewer or shorter inputs per request.",
                           code="request_too_large")
        headers = dict(scope.get("headers") or [])
        try:
            declared = int(headers.get(b"content-length", b"0") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            self.metrics.reject("body_too_large")
            return None, too_big
        chunks, size = [], 0
        deadline = t0 + self.config.limits.body_timeout_s       # a trickled body is cut off
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.perf_counter()))
            except asyncio.TimeoutError:
                self.metrics.reject("body_timeout")
                return None, APIError(408, f"The request body did not arrive within "
                                           f"{self.config.limits.body_timeout_s:g} s; send it "
                                           f"promptly.", code="request_timeout",
                                      headers={"Connection": "close"})
            if message["type"] == "http.disconnect":
                return None, APIError(400, "client disconnected")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                self.metrics.reject("body_too_large")
                return None, too_big
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None


async def _send_json(send, err: APIError, path: str = "", origin: str | None = None) -> None:
    body = json.dumps(error_json(path, err)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if origin:
        headers += [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    for k, v in (err.headers or {}).items():
        headers.append((k.lower().encode("latin-1"), v.encode("latin-1")))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def install_guard(app: FastAPI, config: ServerConfig, srv: "Server") -> None:
    """CORS (when origins are allowed) inside, the Guard outermost: it sees every request."""
    if config.cors_origins:
        # browser-based clients on other origins (web UIs, editor webviews) need CORS; off by
        # default so a web page cannot call a local server unless the user allows its origin
        from fastapi.middleware.cors import CORSMiddleware
        # any request header: the official SDKs send their own (openai's x-stainless-*,
        # anthropic's anthropic-version, x-api-key, anthropic-dangerous-direct-browser-access)
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins,
                           allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                           allow_headers=["*"], max_age=600)
    app.add_middleware(Guard, config=config, metrics=srv.metrics, server=srv)
