"""The built-in chat page: GET /ui (index.html) and GET /ui/{asset} (its script and style), served
from torch_xdna/server/ui/ inside the package, so the page works offline (no CDN).

The page is static; it talks to the server only through the public API (/v1/models,
/v1/chat/completions with SSE, /v1/audio/transcriptions), so it needs nothing a client could not
do. The guard lets /ui and /ui/* through without the API key (the page asks for the key and sends
it as a Bearer header). A strict Content-Security-Policy allows scripts, styles and connections to
this origin only: the page never runs inline code and never loads anything from elsewhere."""
from __future__ import annotations

from functools import lru_cache
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

from torch_xdna.server.schemas import APIError

ASSETS = {"index.html": "text/html; charset=utf-8",
          "app.js": "text/javascript; charset=utf-8",
          "style.css": "text/css; charset=utf-8"}
HEADERS = {"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                                      "connect-src 'self'; img-src 'self' data:; "
                                      "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


@lru_cache(maxsize=None)
def asset(name: str) -> bytes:
    """The bytes of one packaged asset (read once per process)."""
    return resources.files("torch_xdna.server").joinpath("ui", name).read_bytes()


def register(app: FastAPI, srv) -> None:
    """Add /ui and /ui/{asset} to `app`."""

    @app.get("/ui", include_in_schema=False)
    @app.head("/ui", include_in_schema=False)
    async def page():
        return Response(asset("index.html"), media_type=ASSETS["index.html"], headers=HEADERS)

    @app.get("/ui/{name}", include_in_schema=False)
    async def static(name: str):
        if name not in ASSETS:           # a fixed list: no path from the request reaches the disk
            raise APIError(404, f"/ui/{name} does not exist; the chat page is at /ui.",
                           code="not_found")
        return Response(asset(name), media_type=ASSETS[name], headers=HEADERS)
