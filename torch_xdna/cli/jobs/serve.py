"""`xdna serve`: the OpenAI-compatible server. With no arguments it serves the bundled
all-MiniLM-L6-v2 on the simulator at http://127.0.0.1:8000."""
from __future__ import annotations

import argparse
import errno
import logging
import socket

from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES
from torch_xdna.cli.args import (
    CliError, add_command, add_decoder_precision, number, port_number, positive_int, seconds,
)
from torch_xdna.runtime import settings

DESCRIPTION = """\
OpenAI-compatible HTTP server on the (simulated by default) XDNA NPU.
Routes: GET /v1/models, POST /v1/embeddings, POST /v1/chat/completions, POST /v1/completions,
GET /health, GET /metrics, a chat page at /ui (and more: docs/serving.md)."""

EPILOG = """\
examples:
  xdna serve
  curl -s localhost:8000/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{"model": "all-MiniLM-L6-v2", "input": "hello world"}'
  xdna serve --model ~/models/bge-small-en-v1.5 --model chat=~/models/Qwen3-0.6B --api-key KEY
  xdna serve --config /etc/xdna/serve.toml --port 8081
"""


def _gather_ms(text: str) -> float:
    """argparse type: the embedding gather window, 0-1000 ms."""
    value = number(text, float, "a number of milliseconds")
    if not 0.0 <= value <= 1000.0:
        raise argparse.ArgumentTypeError(f"{value:g} ms is not allowed; give 0-1000")
    return value


def register(subparsers) -> None:
    p = add_command(subparsers, "serve", help="OpenAI-compatible server (embeddings, chat)",
                    description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--config", metavar="FILE.toml",
                   help="read flags from a TOML file: the same names without '--' (port = 8080, "
                        "model = [\"chat=~/models/Qwen3-0.6B\"], no-default-model = true); "
                        "flags given on the command line win (docs/serving.md)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default 8000)")
    p.add_argument("--api-key", default=settings.get("XDNA_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 and /metrics "
                        "(default: $XDNA_API_KEY, else no key)")
    p.add_argument("--model", action="append", default=[], metavar="[NAME=]DIR",
                   help="serve a Hugging Face encoder (embeddings) or decoder (chat) directory, a "
                        "GGUF file (FILE.gguf,tokenizer=DIR: with the original tokenizer), a "
                        "CTranslate2 Whisper directory or a packaged checkpoint's name; each is "
                        "checked at startup; repeatable")
    p.add_argument("--alias", action="append", default=[], metavar="ALIAS=MODEL",
                   help="serve MODEL under another name too, e.g. "
                        "text-embedding-3-small=all-MiniLM-L6-v2; repeatable")
    p.add_argument("--no-default-model", action="store_true",
                   help="do not serve the bundled all-MiniLM-L6-v2")
    p.add_argument("--max-queue", type=positive_int, default=64,
                   help="requests waiting for the NPU before new ones get 429 (default 64)")
    p.add_argument("--gather-ms", type=_gather_ms, default=20.0, metavar="MS",
                   help="while concurrent clients send embeddings, wait up to MS ms for their next "
                        "requests to share a device step (0 = never wait; default 20)")
    p.add_argument("--host-threads", type=positive_int, default=None, metavar="N",
                   help="simulator only: host threads that run the independent batches of one "
                        "embedding step at once (one torch thread each; modeled NPU time, order "
                        "and results are unchanged; default: the host's cores, at most 2)")
    p.add_argument("--max-models", type=positive_int, default=2,
                   help="models resident on the device at once; least recently used are unloaded "
                        "(default 2)")
    p.add_argument("--max-inputs", type=positive_int, default=2048,
                   help="inputs per embeddings request (default 2048)")
    p.add_argument("--max-body-bytes", type=positive_int, default=4 << 20,
                   help="request body limit in bytes (default 4 MiB)")
    p.add_argument("--max-context", type=positive_int, metavar="TOKENS",
                   help="chat models' context limit / KV cache capacity (default: the model's "
                        "maximum, capped so the cache takes at most half the memory left after "
                        "the weights)")
    p.add_argument("--prefill-chunk", type=positive_int, metavar="TOKENS",
                   help="chat models' prompt tokens per prefill launch (default 128; with the "
                        "xrt backend, build the artifacts with the same value)")
    p.add_argument("--kv-dtype", choices=KV_DTYPES, default=DEFAULT_KV_DTYPE,
                   help="chat models' KV cache storage (int8: half the bytes per token)")
    add_decoder_precision(p, "bf16, or a .gguf file's own blocks; Whisper models: auto, "
                             "int8, fp32, else bf16")
    p.add_argument("--max-batch", type=positive_int, default=4, metavar="N",
                   help="concurrent chats of one model decoded together, one batched NPU step "
                        "per token (default 4; 1: one request at a time). Fewer when their KV "
                        "caches do not fit the memory budget; requests needing logprobs, "
                        "grammars, penalties or n>1 run alone")
    p.add_argument("--truncate", action="store_true",
                   help="truncate over-long embedding inputs instead of answering 400")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from this origin (e.g. http://localhost:3000; "
                        "'*' for any); repeatable; default: none")
    g = p.add_argument_group("connections and timeouts (docs/serving.md)")
    g.add_argument("--max-connections", type=positive_int, default=1024,
                   help="open connections at once (default 1024; kept below the open-file "
                        "limit). At the limit the longest-idle connection is closed for a new "
                        "one; when all are busy, new ones get 503")
    g.add_argument("--header-timeout", type=seconds, default=10.0, metavar="SECONDS",
                   help="a connection must send its complete request headers within this "
                        "(default 10), else 408 and closed")
    g.add_argument("--body-timeout", type=seconds, default=30.0, metavar="SECONDS",
                   help="the request body must arrive within this after the headers "
                        "(default 30), else 408")
    g.add_argument("--write-timeout", type=seconds, default=60.0, metavar="SECONDS",
                   help="a client that stops reading a response (e.g. a stalled stream) is "
                        "disconnected after this (default 60); its generation stops")
    g.add_argument("--keep-alive", type=seconds, default=5.0, metavar="SECONDS",
                   help="idle keep-alive connections are closed after this (default 5)")
    g.add_argument("--graceful-timeout", type=seconds, default=10.0, metavar="SECONDS",
                   help="on SIGINT/SIGTERM, in-flight requests get this long to finish before "
                        "they are ended with a 503 / an SSE error event (default 10)")
    g.add_argument("--backlog", type=positive_int, default=2048,
                   help="connections the kernel queues before accept (default 2048)")
    g.add_argument("--max-header-bytes", type=positive_int, default=16 << 10,
                   help="request line + headers (default 16 KiB), else 400")
    p.add_argument("--no-preload", action="store_true",
                   help="load models on first request instead of at startup")
    p.set_defaults(func=run, config_parser=p)


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
    from torch_xdna.runtime.settings import bound_native_caches
    bound_native_caches()            # a long-running server: before any op reads the capacities
    try:
        from torch_xdna.server.app import ServerConfig, create_app
        from torch_xdna.server.state import backend_description
        from torch_xdna.server.http import (HttpLimits, XdnaServer, connection_cap,
                                            raise_nofile_limit, uvicorn_config)
    except ImportError as e:
        raise CliError(f"missing dependency ({e.name}); install with: pip install "
                       f"'torch-xdna[serve]'") from e
    log = logging.getLogger("torch_xdna.server")
    limits = HttpLimits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                        keep_alive_s=args.keep_alive, max_connections=args.max_connections,
                        backlog=args.backlog, max_header_bytes=args.max_header_bytes,
                        graceful_timeout_s=args.graceful_timeout,
                        write_timeout_s=args.write_timeout)
    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key or None,
                          models=args.model, aliases=args.alias,
                          default_model=not args.no_default_model,
                          max_queue=args.max_queue, gather_ms=args.gather_ms,
                          host_threads=args.host_threads,
                          max_models=args.max_models,
                          max_inputs=args.max_inputs, max_body_bytes=args.max_body_bytes,
                          truncate=args.truncate, preload=not args.no_preload,
                          cors_origins=args.cors_origin, limits=limits,
                          max_context=args.max_context, kv_dtype=args.kv_dtype,
                          prefill_chunk=args.prefill_chunk,
                          max_batch=args.max_batch, precision=args.precision,
                          precision_budget=args.precision_budget)
    problem = _port_free(args.host, args.port)
    if problem:
        raise CliError(problem)
    nofile = raise_nofile_limit()
    cap = connection_cap(limits.max_connections, nofile)
    if cap < limits.max_connections:
        log.warning("--max-connections %d lowered to %d: the open-file limit is %d (raise it "
                    "with `ulimit -n`)", limits.max_connections, cap, nofile)
    try:
        app = create_app(config)
    except Exception as e:           # a bad --model directory, the bundled model not installed
        raise CliError(_one_line(e)) from e
    srv = app.state.server
    log.info("starting torch-xdna server on %s (backend: %s)", config.url(),
             backend_description(srv.dev))
    if config.preload:
        _preload(srv)                # a model that cannot load: one line and exit 2, not a traceback
    if args.host not in ("127.0.0.1", "localhost", "::1") and not config.api_key:
        log.warning("listening on %s without --api-key: anyone who can reach this address can "
                    "use the server", args.host)
    server = XdnaServer(uvicorn_config(app, args.host, args.port, limits,
                                       log_level=args.log_level, log_config=None),
                         limits.graceful_timeout_s)   # uvicorn's lines: the command's log format
    server.run()
    if not server.started:
        raise CliError(f"the server on {config.url()} did not start (see the log above)")
    return 0


def _preload(srv) -> None:
    """Make the first models resident before uvicorn starts, so that a model directory whose
    weights or config cannot be loaded fails here with its own message."""
    srv.worker.start()
    try:
        srv.worker.call(srv.npu_job(srv.preload)).result()
    except Exception as e:
        srv.worker.stop()
        raise CliError(f"a model could not be loaded: {_one_line(e)}") from e


def _one_line(e: BaseException) -> str:
    """The error on one line; its type too when the message alone would not say what broke."""
    from torch_xdna.runtime.errors import XdnaError
    text = " ".join(str(e).split()).removeprefix("xdna: ")
    if isinstance(e, (ValueError, OSError, XdnaError, RuntimeError)) and text:
        return text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
