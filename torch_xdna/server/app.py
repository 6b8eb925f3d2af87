"""The OpenAI-compatible HTTP API: create_app(config) -> FastAPI app.

Request path: ASGI guard (auth, body limit, metrics) -> parse + validate (400 in OpenAI's error
shape) -> tokenize on a thread pool -> ONE device worker queue (429 when full) -> engine -> JSON or
SSE. Everything that can be rejected is rejected before the request takes a place on the NPU.
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import threading
import time
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.runtime import DeviceOutOfMemory, get_device
from torch_xdna.server.http import HttpLimits
from torch_xdna.server.metrics import Metrics
from torch_xdna.server.registry import ModelEntry, ModelRegistry
from torch_xdna.server.schemas import APIError, EmbeddingRequest, error_body, find_surrogate
from torch_xdna.server.worker import DeviceWorker, Job, QueueFull, WorkerStopped

log = logging.getLogger("torch_xdna.server")
ROUTES = ("/health", "/metrics", "/v1/models", "/v1/embeddings", "/v1/chat/completions",
          "/v1/completions", "/api/chat", "/api/generate", "/api/embed", "/api/embeddings",
          "/api/tags", "/api/show", "/api/ps", "/api/version", "/v1/rerank", "/rerank",
          "/v1/audio/transcriptions", "/v1/audio/translations")   # metrics labels


@dataclass
class ServerConfig:
    """Everything `xdna serve` can set. `models`: directories ("DIR" or "NAME=DIR")."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    models: list[str] = field(default_factory=list)
    default_model: bool = True            # offer the bundled all-MiniLM-L6-v2
    max_queue: int = 64                   # waiting requests before 429
    gather_ms: float = 20.0               # embedding merge window when clients overlap (worker.py)
    host_threads: int | None = None       # sim host lanes (None: runtime/sim/lanes.default_host_lanes)
    max_models: int = 2                   # resident models (LRU)
    max_body_bytes: int = 4 << 20
    max_audio_bytes: int = 25 << 20       # /v1/audio/* uploads (OpenAI's 25 MB file limit)
    max_inputs: int = 2048                # inputs per embeddings request (OpenAI's limit)
    max_request_tokens: int = 65536       # tokens per embeddings request
    truncate: bool = False                # over-long embedding inputs: truncate instead of 400
    max_new_tokens: int = 2048            # completion tokens per request
    max_context: int | None = None        # chat models' KV capacity (None: from the memory budget)
    kv_dtype: str = DEFAULT_KV_DTYPE      # chat models' KV storage: bf16 | int8
    max_batch: int = 4                    # chats decoded together per step (1: no batching)
    request_timeout_s: float = 300.0
    preload: bool = True                  # make the first models resident at startup
    cors_origins: list[str] = field(default_factory=list)   # browser origins allowed (CORS)
    limits: HttpLimits = field(default_factory=HttpLimits)  # connections, timeouts, shutdown

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def backend_description(dev) -> str:
    if dev.backend == "sim":
        return f"simulated NPU ({dev.gen.name}; timings are modeled, not measured)"
    return f"{dev.backend} NPU ({dev.gen.name})"


# --- ASGI guard: auth, body size, metrics ---------------------------------------------------------
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
                await _send_json(send_wrapped, error)
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

    def _check_auth(self, scope, path: str) -> APIError | None:
        key = self.config.api_key
        if not key or path == "/health":
            return None
        headers = dict(scope.get("headers") or [])
        # compare bytes: ASGI hands over the raw header bytes (a UTF-8 key arrives as its UTF-8
        # bytes; decoding them as latin-1 and re-encoding as UTF-8 would never match)
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else b""
        if not given:
            self.metrics.reject("auth")
            return APIError(401, "You didn't provide an API key. Send it as 'Authorization: "
                                 "Bearer KEY' (the --api-key given to xdna serve).",
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


async def _send_json(send, err: APIError) -> None:
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if err.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    for k, v in (err.headers or {}).items():
        headers.append((k.lower().encode("latin-1"), v.encode("latin-1")))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- request parsing ------------------------------------------------------------------------------
FRIENDLY = {
    "input": "'input' must be a non-empty string, an array of strings, an array of token ids, "
             "or an array of token-id arrays",
    "messages": "'messages' must be a non-empty array of {role, content} objects "
                "(roles: system, developer, user, assistant; text content only)",
    "prompt": "'prompt' must be a string (or an array holding one string)",
}


async def parse(request: Request, model: type[BaseModel]) -> Any:
    body = await request.body()
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise APIError(400, f"We could not parse the JSON body of your request ({e}). Send a "
                            f"JSON object with Content-Type: application/json.") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    where = find_surrogate(data)
    if where is not None:           # valid JSON ("\\ud800"), but no tokenizer can encode it
        param = where.split(".")[0].split("[")[0]
        raise APIError(400, f"'{where}' contains an unpaired UTF-16 surrogate (such as \\ud800), "
                            f"which is not valid Unicode text; send well-formed UTF-8 or pair the "
                            f"surrogates.", param=param, code="invalid_value")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e) from None


def validation_error(e: ValidationError) -> APIError:
    errs = e.errors()
    extra = [x for x in errs if x["type"] == "extra_forbidden"]
    if extra:
        name = ".".join(str(p) for p in extra[0]["loc"])
        return APIError(400, f"Unrecognized request argument supplied: {name}", param=name,
                        code="unknown_parameter")
    missing = [x for x in errs if x["type"] == "missing"]
    if missing:
        name = str(missing[0]["loc"][0])
        return APIError(400, f"Missing required parameter: '{name}'.", param=name,
                        code="missing_required_parameter")
    first = errs[0]
    name = str(first["loc"][0]) if first["loc"] else None
    msg = FRIENDLY.get(name or "") or f"Invalid value for '{name}': {first['msg']}"
    if first["type"] == "value_error" and (first["loc"] == ()
                                           or first["msg"].startswith("Value error, '")):
        msg = first["msg"].removeprefix("Value error, ")
    elif name == "seed":
        msg = (f"Invalid value for 'seed': {first.get('input')!r}; it must be an integer in "
               f"[-2**63, 2**64 - 1].")
    return APIError(400, msg, param=name, code="invalid_value")


# --- the app --------------------------------------------------------------------------------------
class Cancel:
    """A generation's stop flag, checked before every token; `reason` says who stopped it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None          # "client" (went away) | "shutdown" | "done"

    def set(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()


def client_gone() -> APIError:
    # 499 (nginx's "client closed request"): nobody reads it; it labels the metrics
    return APIError(499, "the client closed the connection", code="client_closed_request")


def shutting_down(tokens: int | None = None) -> APIError:
    done = "" if tokens is None else f" after {tokens} token(s)"
    return APIError(503, f"The server is shutting down; the request was stopped{done}. Retry it "
                         f"after the server restarts.", type="server_error", code="shutting_down")


class ModelLoadFailed(Exception):
    """A served model could not be made resident (details in the server log, not the client's)."""


class Server:
    """State shared by the routes: device, registry, worker, metrics."""

    def __init__(self, config: ServerConfig, registry: ModelRegistry | None = None):
        self.config = config
        self.metrics = Metrics()
        self.dev = get_device()
        self.registry = registry or ModelRegistry(config.max_models, config.max_context,
                                                   config.kv_dtype)
        if registry is None:
            if config.default_model:
                try:
                    self.registry.add_default_embedding()
                except RuntimeError as e:          # bundled model package not installed
                    if not config.models:
                        raise
                    log.warning("%s; serving only the --model directories", e)
            for spec in config.models:
                name, path = parse_model_arg(spec)
                self.registry.add_dir(path, name)
        if not self.registry.entries:
            raise ValueError("no models to serve: give --model DIR or keep the default model")
        self.worker = DeviceWorker(config.max_queue, gather_s=config.gather_ms / 1e3)
        if hasattr(self.dev, "set_host_lanes"):   # sim: a merged step's batches use the cores
            from torch_xdna.runtime.sim.lanes import default_host_lanes
            self.dev.set_host_lanes(config.host_threads or default_host_lanes())
        from torch_xdna.server.batching import Batcher
        self.batcher = Batcher(self, config.max_batch)     # concurrent chats decode together
        self.shutting_down = False
        self.preloaded = False
        # generations in flight -> how to end their request at the shutdown deadline
        self._active: dict[Cancel, Callable[[], None]] = {}
        self._active_lock = threading.Lock()
        self._waiters: set[asyncio.Future] = set()    # requests awaiting a job (event loop only)
        m = self.metrics
        m.gauge("xdna_queue_depth", "requests waiting for the device", lambda: self.worker.depth)
        m.gauge("xdna_models_resident", "models resident on the device",
                lambda: len(self.registry.loaded))
        m.gauge("xdna_device_allocated_bytes", "device memory allocated",
                lambda: self.dev.counters.allocated_bytes)

    # -- worker plumbing --
    def submit(self, job: Job) -> Future:
        try:
            fut = self.worker.submit(job)
        except QueueFull as e:
            self.metrics.reject("queue_full")
            raise APIError(429, f"{e}; retry shortly or raise --max-queue.",
                           type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except WorkerStopped as e:
            raise APIError(503, str(e), type="server_error", code="shutting_down") from None
        return fut

    async def wait(self, fut: Future, request: Request | None = None) -> Any:
        """The job's result; gives up (and drops the job if it has not started) when the
        client disconnects or the device does not finish within request_timeout_s."""
        wrapped = asyncio.wrap_future(fut)
        watch = asyncio.ensure_future(until_disconnected(request)) if request else None
        ended = asyncio.get_running_loop().create_future()     # the shutdown deadline passed
        self._waiters.add(ended)
        try:
            done, _ = await asyncio.wait({wrapped, ended} | ({watch} if watch else set()),
                                         timeout=self.config.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiters.discard(ended)
            if watch is not None:
                watch.cancel()
        if wrapped in done:
            try:
                return wrapped.result()
            except WorkerStopped:
                raise shutting_down() from None
        fut.cancel()
        if ended in done:
            raise shutting_down()
        if watch is not None and watch in done:
            self.metrics.reject("client_gone")
            raise client_gone()
        self.metrics.reject("timeout")
        raise APIError(503, f"The request did not finish within {self.config.request_timeout_s}"
                            f" s on the device; retry later.", type="server_error",
                       code="timeout")

    def load(self, entry: ModelEntry) -> Any:
        """The resident model of `entry` (worker thread). A load failure is logged here in full;
        the client learns only that the model could not be loaded (no server paths)."""
        try:
            return self.registry.get(entry)
        except DeviceOutOfMemory:
            raise
        except Exception as e:
            log.error("loading model %r failed: %s: %s", entry.id, type(e).__name__, e)
            raise ModelLoadFailed(entry.id) from e

    # -- shutdown --
    def track(self, cancel: Cancel, end_request: Callable[[], None]) -> None:
        """A generation in flight; at the shutdown deadline it is cancelled and `end_request`
        (event loop) answers its request at once, whatever the device is doing."""
        with self._active_lock:
            self._active[cancel] = end_request

    def untrack(self, cancel: Cancel) -> None:
        with self._active_lock:
            self._active.pop(cancel, None)

    def begin_shutdown(self, grace_s: float) -> None:
        """SIGINT/SIGTERM (event loop): refuse new requests now; let the ones in flight run for
        grace_s, then stop them at their next token (503 JSON / SSE error event + [DONE])."""
        if self.shutting_down:
            return
        self.shutting_down = True
        with self._active_lock:
            n = len(self._active)
        log.info("shutting down: %d generation(s) in flight get %g s to finish", n, grace_s)
        asyncio.get_running_loop().call_later(grace_s, self.end_in_flight)

    def end_in_flight(self) -> None:
        """The grace period is over (event loop): answer every waiting request now, so none is
        left for uvicorn to cancel into a plain-text 500."""
        with self._active_lock:
            active = list(self._active.items())
        for cancel, end_request in active:
            cancel.set("shutdown")
            end_request()
        for ended in list(self._waiters):
            if not ended.done():
                ended.set_result(None)
        self.worker.fail_pending()

    def npu_job(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Wrap device work so its dispatches and modeled time land in the metrics."""
        def run(*args):
            c = self.dev.counters
            d0, us0 = c.dispatches, c.modeled_us
            try:
                return fn(*args)
            finally:
                c = self.dev.counters
                self.metrics.add_npu(c.dispatches - d0, c.modeled_us - us0)
        return run

    def preload(self) -> None:
        """Make the first models resident; run one tiny embedding so the first request does not
        pay for planning the smallest bucket's designs."""
        for entry in list(self.registry.entries.values())[:self.config.max_models]:
            model = self.registry.get(entry)
            if entry.kind == "embedding":
                model.embed(["warm up"])
            elif entry.kind == "image":
                model.warm_up()                     # compile the single-image shape
        self.preloaded = True


def parse_model_arg(spec: str) -> tuple[str | None, str]:
    """"DIR" or "NAME=DIR" -> (name or None, dir); an existing directory is never split."""
    if "=" not in spec or Path(spec).expanduser().is_dir():
        return None, spec
    name, _, path = spec.partition("=")
    return name or None, path


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
    if config.cors_origins:
        # browser-based clients on other origins (web UIs, editor webviews) need CORS; off by
        # default so a web page cannot call a local server unless the user allows its origin
        from fastapi.middleware.cors import CORSMiddleware
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins,
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = (f"Unknown request URL: {request.method} {request.url.path}. See /v1/models, "
               f"/v1/embeddings, /v1/chat/completions, /v1/completions." if e.status_code == 404
               else str(e.detail))
        return JSONResponse(error_body(msg, code="not_found" if e.status_code == 404 else None),
                            status_code=e.status_code)

    @app.exception_handler(ModelLoadFailed)
    @app.exception_handler(DeviceOutOfMemory)
    @app.exception_handler(WorkerStopped)
    async def _known(request: Request, e: Exception):
        err = _as_api_error(e)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        err = _as_api_error(e)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.get("/health")
    async def health():
        return {"status": "ok", "backend": srv.dev.backend,
                "backend_description": backend_description(srv.dev),
                "generation": srv.dev.gen.name,
                "models": list(srv.registry.entries), "resident": srv.registry.loaded_ids(),
                "queue_depth": srv.worker.depth, "max_queue": config.max_queue}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(srv.metrics.render(), media_type="text/plain; version=0.0.4")

    def model_card(e: ModelEntry) -> dict:
        card = {"id": e.id, "object": "model", "created": e.created, "owned_by": "torch-xdna",
                "kind": e.kind}
        if e.spec is not None:
            card.update(dimensions=e.spec.dim, max_input_tokens=e.spec.max_seq_length)
        return card

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(e) for e in srv.registry.entries.values()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        e = srv.registry.entries.get(model_id)
        if e is None:
            raise APIError(404, f"The model '{model_id}' does not exist.", param="model",
                           code="model_not_found")
        return model_card(e)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        req: EmbeddingRequest = await parse(request, EmbeddingRequest)
        entry = srv.registry.resolve(req.model, ("embedding", "image"))
        if entry.kind == "image":                 # base64 image data URLs (server/vision.py)
            from torch_xdna.server.vision import image_embeddings
            return await image_embeddings(srv, request, req, entry)
        if req.dimensions is not None and req.dimensions > entry.spec.dim:
            raise APIError(400, f"'dimensions' is {req.dimensions}, but {entry.id} produces "
                                f"{entry.spec.dim}-dimensional vectors.", param="dimensions",
                           code="invalid_value")
        seqs = await run_in_threadpool(tokenize_inputs, entry, req.input, config)
        n_tokens = sum(len(s) for s in seqs)

        def run_batch(payloads: list[list[list[int]]]) -> list[tuple[torch.Tensor, dict]]:
            from torch_xdna.engine.embed.embedder import EmbedStats
            model = srv.load(entry)
            stats = EmbedStats()
            flat = [s for p in payloads for s in p]
            vecs = model.embed_ids(flat, stats)
            out, i = [], 0
            for p in payloads:
                out.append((vecs[i:i + len(p)], {"modeled_us": stats.modeled_us,
                                                 "merged": len(payloads)}))
                i += len(p)
            return out

        job = Job(batch_key=("embed", entry.id), batch_fn=srv.npu_job(run_batch), payload=seqs,
                  size=len(seqs))
        vecs, info = await srv.wait(srv.submit(job), request)
        if req.dimensions is not None and req.dimensions < vecs.shape[1]:
            vecs = torch.nn.functional.normalize(vecs[:, :req.dimensions], dim=-1)
        srv.metrics.add_tokens(entry.id, "prompt", n_tokens)
        srv.metrics.add_embeddings(entry.id, len(seqs))
        data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
                for i, v in enumerate(vecs)]
        headers = {"x-xdna-backend": srv.dev.backend,     # NPU time of the (merged) batch
                   "x-xdna-modeled-npu-ms": f"{info['modeled_us'] / 1e3:.3f}",
                   "x-xdna-merged-requests": str(info["merged"])}
        return JSONResponse({"object": "list", "data": data, "model": entry.id,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}},
                            headers=headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        from torch_xdna.server.completions import chat_completion   # imports this module
        return await chat_completion(srv, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        from torch_xdna.server.completions import text_completion
        return await text_completion(srv, request)

    register_route_modules(app, srv)
    app.add_middleware(Guard, config=config, metrics=srv.metrics, server=srv)
    return app


# API surfaces, one module each (torch_xdna/server/routes/<name>.py exposing
# `register(app, srv)`), so each surface (Ollama, reranking, audio...) lives in its own file.
ROUTE_MODULES = ("ollama", "rerank", "audio")


def register_route_modules(app: FastAPI, srv: "Server") -> None:
    import importlib
    for name in ROUTE_MODULES:
        importlib.import_module(f"torch_xdna.server.routes.{name}").register(app, srv)


# --- embeddings helpers ---------------------------------------------------------------------------
def tokenize_inputs(entry: ModelEntry, inp, config: ServerConfig) -> list[list[int]]:
    """Request input -> model inputs with special tokens, length-checked (400 on violations)."""
    tok, spec = entry.tokenizer, entry.spec
    if isinstance(inp, str):
        inp = [inp]
    if not inp:
        raise APIError(400, "'input' must not be empty.", param="input", code="invalid_value")
    if isinstance(inp[0], int):
        inp = [inp]
    if len(inp) > config.max_inputs:
        raise APIError(400, f"'input' has {len(inp)} items; at most {config.max_inputs} inputs "
                            f"per request. Split the request.", param="input",
                       code="too_many_inputs")
    if isinstance(inp[0], str):
        for i, t in enumerate(inp):
            if not t:
                raise APIError(400, f"'input[{i}]' is an empty string; every input must contain "
                                    f"text.", param="input", code="invalid_value")
        seqs = tok.encode(inp)
    else:
        seqs = []
        for i, ids in enumerate(inp):
            if not ids:
                raise APIError(400, f"'input[{i}]' is an empty token array.", param="input",
                               code="invalid_value")
            bad = [t for t in ids if not 0 <= t < spec.vocab]
            if bad:
                raise APIError(400, f"'input[{i}]' holds token id {bad[0]}, outside {entry.id}'s "
                                    f"vocabulary [0, {spec.vocab}).", param="input",
                               code="invalid_value")
            seqs.append(tok.wrap(ids))
    limit = spec.max_seq_length
    for i, s in enumerate(seqs):
        if len(s) > limit:
            if config.truncate:
                seqs[i] = tok.truncate(s)
                continue
            raise APIError(400, f"'input[{i}]' is {len(s)} tokens long; {entry.id} accepts at most "
                                f"{limit} tokens per input (special tokens included). Shorten or "
                                f"split it (or start the server with --truncate).", param="input",
                           code="context_length_exceeded")
    total = sum(len(s) for s in seqs)
    if total > config.max_request_tokens:
        raise APIError(400, f"the request holds {total} tokens; at most "
                            f"{config.max_request_tokens} per request. Split it.", param="input",
                       code="too_many_tokens")
    return seqs


def encode_vector(v: torch.Tensor, fmt: str):
    if fmt == "base64":
        # OpenAI's encoding: the raw little-endian float32 bytes, base64
        return base64.b64encode(v.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()
    return v.tolist()


# --- generation -----------------------------------------------------------------------------------
async def until_disconnected(request: Request) -> None:
    """Returns when the client has gone away. The body has been read by then, so the next ASGI
    message can only be http.disconnect (uvicorn also sends it once the response is complete;
    callers cancel this first)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _event_error(ev: tuple) -> BaseException:
    """The error an "error" or "done" event stands for ("done" before "end": the job never ran
    or died without a word)."""
    if ev[0] == "error":
        return ev[1]
    f: Future = ev[1]
    if f.cancelled():
        return client_gone()
    return f.exception() or RuntimeError("the generation job ended without a result")


async def _next_event(srv: Server, events: asyncio.Queue, fut) -> tuple:
    """The next event of a generation job; waits for the job to start within the timeout."""
    deadline = srv.config.request_timeout_s
    try:
        return await asyncio.wait_for(events.get(), deadline)
    except asyncio.TimeoutError:
        fut.cancel()
        srv.metrics.reject("timeout")
        return ("error", APIError(503, f"no progress within {deadline} s on the device; retry "
                                       f"later.", type="server_error", code="timeout"))


def _as_api_error(e: BaseException) -> APIError:
    """Any failure -> the client's error. Messages never carry server paths (error_body scrubs
    them); unexpected errors are logged in full and answered without their text."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, WorkerStopped):
        return shutting_down()
    if isinstance(e, DeviceOutOfMemory):
        return APIError(503, "The NPU is out of memory for this request; retry later or with "
                             "fewer or shorter inputs.", type="server_error",
                        code="device_out_of_memory")
    if isinstance(e, ModelLoadFailed):
        return APIError(500, f"The model '{e.args[0]}' could not be loaded on the server; the "
                             f"server log has the details.", type="server_error",
                        code="model_load_failed")
    if isinstance(e, ValueError):           # the engine's verdict on this request's input
        code = "context_length_exceeded" if type(e).__name__ == "ContextOverflow" else None
        return APIError(400, getattr(e, "public_message", None) or str(e), code=code)
    log.error("request failed", exc_info=e)
    return APIError(500, f"internal server error ({type(e).__name__}); the server log has the "
                         f"details.", type="server_error")
