"""`xdna serve`: the OpenAI-compatible server. With no arguments it serves the bundled
all-MiniLM-L6-v2 on the simulator at http://127.0.0.1:8000."""
from __future__ import annotations

import argparse
import errno
import logging
import os
import socket

from torch_xdna.cli.common import CliError, port_number, positive_int

DESCRIPTION = """\
OpenAI-compatible HTTP server on the (simulated by default) XDNA NPU.
Routes: GET /v1/models, POST /v1/embeddings, POST /v1/chat/completions, POST /v1/completions,
GET /health, GET /metrics. See docs/serving.md."""

EPILOG = """\
examples:
  xdna serve
  curl -s localhost:8000/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{"model": "all-MiniLM-L6-v2", "input": "hello world"}'
  xdna serve --model ~/models/bge-small-en-v1.5 --model chat=~/models/Qwen3-0.6B --api-key KEY
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible server (embeddings, chat)",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=os.environ.get("XDNA_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and /metrics "
                        "(default: $XDNA_API_KEY, else no key)")
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]DIR",
                   help="serve a Hugging Face encoder (embeddings) or decoder (chat) directory; "
                        "repeatable")
    p.add_argument("--no-default-model", action="store_true",
                   help="do not serve the bundled all-MiniLM-L6-v2")
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests waiting for the NPU before new ones get 429 (default 64)")
    p.add_argument("--max-models", type=positive_int, default=2,
                   help="models resident on the device at once; least recently used are unloaded "
                        "(default 2)")
    p.add_argument("--max-inputs", type=positive_int, default=2048,
                   help="inputs per embeddings request (default 2048)")
    p.add_argument("--max-body-bytes", type=positive_int, default=4 << 20,
                   help="request body limit in bytes (default 4 MiB)")
    p.add_argument("--truncate", action="store_true",
                   help="truncate over-long embedding inputs instead of answering 400")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this origin (e.g. http://localhost:3000; "
                        "'*' for any); repeatable; default: none")
    p.add_argument("--no-preload", action="store_true",
                   help="load models on first request instead of at startup")
    p.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run)


def _port_free(host: str, port: int) -> str | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use; pass --port N (or stop the other server)"
            return f"cannot bind {host}:{port}: {e.strerror}"
    return None


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn
        from torch_xdna.server.app import ServerConfig, backend_description, create_app
    except ImportError as e:
        raise CliError(f"missing dependency ({e.name}); install with: pip install "
                       f"'torch-xdna[serve]'") from e
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("torch_xdna.server")
    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key or None,
                          models=args.model, default_model=not args.no_default_model,
                          max_queue=args.max_queue, max_models=args.max_models,
                          max_inputs=args.max_inputs, max_body_bytes=args.max_body_bytes,
                          truncate=args.truncate, preload=not args.no_preload,
                          cors_origins=args.cors_origin)
    problem = _port_free(args.host, args.port)
    if problem:
        raise CliError(problem)
    try:
        app = create_app(config)
    except RuntimeError as e:        # e.g. the bundled model's package is not installed
        raise CliError(str(e)) from e
    srv = app.state.server
    log.info("starting torch-xdna server on %s (backend: %s)", config.url(),
             backend_description(srv.dev))
    if args.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        log.warning("listening on %s without --api-key: anyone who can reach this address can "
                    "use the server", args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)
    return 0
