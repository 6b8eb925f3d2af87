"""Failures -> the client's error, in one place: what a device, worker or model failure answers
(as_api_error), the two errors a request can end with at any time (client_gone, shutting_down),
and the app's exception handlers that send them in OpenAI's error shape."""
from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from torch_xdna.runtime import DeviceOutOfMemory
from torch_xdna.server.schemas import APIError
from torch_xdna.server.worker import WorkerStopped

log = logging.getLogger("torch_xdna.server")


class ModelLoadFailed(Exception):
    """A served model could not be made resident: (model id, the client's one-line cause)."""


def client_gone() -> APIError:
    # 499 (nginx's "client closed request"): nobody reads it; it labels the metrics
    return APIError(499, "the client closed the connection", code="client_closed_request")


def shutting_down(tokens: int | None = None) -> APIError:
    done = "" if tokens is None else f" after {tokens} token(s)"
    return APIError(503, f"The server is shutting down; the request was stopped{done}. Retry it "
                         f"after the server restarts.", type="server_error", code="shutting_down")


def as_api_error(e: BaseException) -> APIError:
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
        why = e.args[1] if len(e.args) > 1 else (f"The model '{e.args[0]}' could not be "
                                                  "loaded; the server log has the details.")
        return APIError(500, why, type="server_error", code="model_load_failed")
    if isinstance(e, ValueError):           # the engine's verdict on this request's input
        code = "context_length_exceeded" if type(e).__name__ == "ContextOverflow" else None
        return APIError(400, getattr(e, "public_message", None) or str(e), code=code)
    ref = uuid.uuid4().hex[:12]             # the client quotes it; the log line carries it
    log.error("request failed (error id %s)", ref, exc_info=e)
    return APIError(500, f"internal server error; the server log has the details under error id "
                         f"{ref}.", type="server_error")


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(e: APIError) -> dict:
    """Anthropic's error shape: {"type": "error", "error": {"type", "message"}}."""
    kind = ANTHROPIC_TYPES.get(e.status, "api_error" if e.status >= 500 else
                               "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": e.body()["error"]["message"]}}


def error_json(path: str, e: APIError) -> dict:
    """The error body in the shape the API at `path` speaks: Ollama's {"error": "..."} on
    /api/*, Anthropic's on /v1/messages*, else OpenAI's."""
    if path.startswith("/api/"):
        return {"error": e.body()["error"]["message"]}
    if path.startswith("/v1/messages"):
        return anthropic_error(e)
    return e.body()


def install_error_handlers(app: FastAPI) -> None:
    """Every exception a route lets through is answered in its API's error shape (error_json)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(error_json(request.url.path, e), status_code=e.status,
                            headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = (f"Unknown request URL: {request.method} {request.url.path}. See /v1/models, "
               f"/v1/embeddings, /v1/chat/completions, /v1/completions." if e.status_code == 404
               else str(e.detail))
        err = APIError(e.status_code, msg, code="not_found" if e.status_code == 404 else None)
        return JSONResponse(error_json(request.url.path, err), status_code=e.status_code)

    @app.exception_handler(ModelLoadFailed)
    @app.exception_handler(DeviceOutOfMemory)
    @app.exception_handler(WorkerStopped)
    async def _known(request: Request, e: Exception):
        err = as_api_error(e)
        return JSONResponse(error_json(request.url.path, err), status_code=err.status,
                            headers=err.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        err = as_api_error(e)
        return JSONResponse(error_json(request.url.path, err), status_code=err.status,
                            headers=err.headers)
