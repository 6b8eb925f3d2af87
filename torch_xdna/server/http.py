"""The HTTP transport under the app: uvicorn's h11 protocol with the limits a public server needs.

uvicorn times out idle keep-alive connections but not a client that opens a socket and never
finishes its request headers (slowloris), and it has no connection cap below the file-descriptor
limit: ~20,000 such sockets made /health stop answering. Here:

- every connection must complete its request headers within `header_timeout_s` (from accept,
  and again after each response), else it gets 408 and is closed;
- at most `max_connections` are open; at the cap a new connection evicts the longest-idle one
  (no request in progress: idle keep-alive or partial headers), so a flood of idle sockets never
  locks out real clients; when every connection is busy the new one gets a JSON 503;
- a client that stops reading a response (its socket's receive window stays full) has
  `write_timeout_s` to drain it, else the connection is aborted; its generation then stops as
  for any disconnect, instead of the request holding its device slot and buffers forever;
- the cap stays below RLIMIT_NOFILE (whose soft limit `raise_nofile_limit` lifts to the hard one);
- on SIGINT/SIGTERM `XdnaServer` lets in-flight requests run for `graceful_timeout_s`, then ends
  them itself (503 JSON, or an SSE error event and [DONE]) before uvicorn would cancel them into a
  plain-text 500.
"""
from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("torch_xdna.server")
REFUSING_MAX = 64          # refused connections held (<= 1 s each) to answer them 503
FD_RESERVE = 128 + REFUSING_MAX   # fds kept for model files, threads, logs, refusals, the listener


@dataclass
class HttpLimits:
    """Transport limits of `xdna serve` (docs/serving.md, "Connections and timeouts")."""

    header_timeout_s: float = 10.0        # accept (or previous response) -> complete headers
    body_timeout_s: float = 30.0          # headers -> complete body (enforced by the app's Guard)
    keep_alive_s: float = 5.0             # idle keep-alive connection -> closed
    max_connections: int = 1024           # open connections (capped below RLIMIT_NOFILE)
    backlog: int = 2048                   # listen(2) queue of not-yet-accepted connections
    max_header_bytes: int = 16 << 10      # request line + headers (h11); over -> 400 and close
    graceful_timeout_s: float = 10.0      # SIGINT/SIGTERM -> in-flight requests ended
    write_timeout_s: float = 60.0         # response blocked by a client not reading -> aborted

    def validate(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "graceful_timeout_s",
                     "write_timeout_s"):
            v = getattr(self, name)
            if not (v > 0 and v < float("inf")):
                raise ValueError(f"{name} must be a finite number of seconds > 0 (got {v})")
        for name in ("max_connections", "backlog", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")


def raise_nofile_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit where allowed; returns the soft limit."""
    try:
        import resource
    except ImportError:                     # not POSIX
        return 1 << 16
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(requested: int, nofile: int | None = None) -> int:
    """`requested`, lowered so the open connections can never exhaust the descriptor limit."""
    if nofile is None:
        try:
            import resource
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except ImportError:
            return requested
    return max(1, min(requested, nofile - FD_RESERVE))


def _raw_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n")
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


TIMEOUT_408 = _raw_response(408, "Request Timeout", "The request headers did not arrive in time; "
                            "send the complete request promptly.", "request_timeout")
BUSY_503 = _raw_response(503, "Service Unavailable", "The server is at its connection limit; retry "
                         "shortly.", "too_many_connections")


class ConnectionPool:
    """The open connections of one server: the cap, and the idle ones in eviction order."""

    def __init__(self, limits: HttpLimits):
        self.limits = limits
        self.cap = connection_cap(limits.max_connections)
        self.open = 0
        self.peak = 0                     # most connections open at once
        self.idle: OrderedDict[Any, None] = OrderedDict()     # oldest first
        self.evicted = 0
        self.refused = 0
        self.refusing = 0                 # refused connections waiting for their request
        self.header_timeouts = 0
        self.write_timeouts = 0
        self.on_reject: Callable[[str], None] = lambda reason: None     # the app's metrics


def protocol_class(limits: HttpLimits) -> type[H11Protocol]:
    """An H11Protocol subclass bound to one server's limits and connection pool."""
    pool = ConnectionPool(limits)

    class XdnaH11Protocol(H11Protocol):
        connection_pool = pool

        def connection_made(self, transport) -> None:  # type: ignore[override]
            self._header_timer = None
            self._write_timer = None
            self._last_cycle = None
            self._counted = False
            self._refusing = False
            if pool.open >= pool.cap and not self._evict_one():
                self._refuse(transport)
                return
            pool.open += 1
            pool.peak = max(pool.peak, pool.open)
            self._counted = True
            super().connection_made(transport)
            self._mark_idle()

        def _evict_one(self) -> bool:
            while pool.idle:
                victim, _ = pool.idle.popitem(last=False)
                if not victim.transport.is_closing():
                    pool.evicted += 1
                    victim._close_now()
                    pool.open -= 1            # its connection_lost comes later; free the slot now
                    victim._counted = False
                    return True
            return False

        def _refuse(self, transport) -> None:
            """Every connection is busy: answer this one 503 once its request arrives (a reply
            before the request could be lost to a TCP reset), within one second."""
            pool.refused += 1
            pool.on_reject("too_many_connections")
            self.transport = transport
            if pool.refusing >= REFUSING_MAX:          # a flood: no answer, just close
                transport.close()
                return
            pool.refusing += 1
            self._refusing = True
            self._header_timer = self.loop.call_later(1.0, self._refused_reply)

        def _refused_reply(self) -> None:
            self._header_timer = None
            if self._refusing:
                self._refusing = False
                pool.refusing -= 1
                if not self.transport.is_closing():
                    self.transport.write(BUSY_503)
                    self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.flow is None:                     # refused: super() never saw it
                if self._refusing:
                    self._cancel_header_timer()
                    self._refused_reply()
                return
            super().data_received(data)

        def _close_now(self) -> None:
            self._cancel_header_timer()
            self._unset_keepalive_if_required()
            self.transport.close()

        def connection_lost(self, exc) -> None:
            self._cancel_header_timer()
            self._cancel_write_timer()
            pool.idle.pop(self, None)
            if not self._counted:
                if self.flow is None:          # refused: super() never saw this connection
                    if self._refusing:
                        self._refusing = False
                        pool.refusing -= 1
                    return
            else:
                pool.open -= 1
                self._counted = False
            super().connection_lost(exc)

        # -- waiting for a request: idle, with the header timer running --
        def _mark_idle(self) -> None:
            pool.idle[self] = None
            pool.idle.move_to_end(self)
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or (self.cycle is not None
                                               and not self.cycle.response_complete):
                return
            pool.header_timeouts += 1
            pool.on_reject("header_timeout")
            pool.idle.pop(self, None)
            self._unset_keepalive_if_required()
            if self.conn.their_state is h11.IDLE and self.conn.our_state in (h11.IDLE, h11.DONE):
                self.transport.write(TIMEOUT_408)
            self.transport.close()

        # -- a response the client does not read: the write timer runs while writing is paused --
        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._write_timer = self.loop.call_later(limits.write_timeout_s,
                                                         self._write_timeout)

        def resume_writing(self) -> None:
            self._cancel_write_timer()
            super().resume_writing()

        def _cancel_write_timer(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_timeout(self) -> None:
            """The client left its receive window full for `write_timeout_s`: abort (no FIN
            handshake to wait for). connection_lost marks the request disconnected, which stops
            its generation and releases the app's pending send."""
            self._write_timer = None
            if self.transport.is_closing():
                return
            pool.write_timeouts += 1
            pool.on_reject("write_timeout")
            log.warning("closing a connection whose client stopped reading for %.0f s",
                        limits.write_timeout_s)
            self.transport.abort()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and self.cycle is not self._last_cycle:
                self._last_cycle = self.cycle          # headers complete: a request started
                self._cancel_header_timer()
                pool.idle.pop(self, None)

        def on_response_complete(self) -> None:
            if not self.transport.is_closing():
                self._mark_idle()
            super().on_response_complete()

    return XdnaH11Protocol


def uvicorn_config(app, host: str, port: int, limits: HttpLimits, log_level: str = "info",
                   **kw) -> uvicorn.Config:
    limits.validate()
    http = protocol_class(limits)
    srv = getattr(getattr(app, "state", None), "server", None)
    if srv is not None:                      # connection figures in /metrics
        pool = http.connection_pool
        pool.on_reject = srv.metrics.reject
        srv.metrics.gauge("xdna_connections_open", "open HTTP connections", lambda: pool.open)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=http,
                          timeout_keep_alive=limits.keep_alive_s,  # type: ignore[arg-type]
                          backlog=limits.backlog,
                          h11_max_incomplete_event_size=limits.max_header_bytes,
                          timeout_graceful_shutdown=limits.graceful_timeout_s + 5.0, **kw)


class XdnaServer(uvicorn.Server):
    """uvicorn.Server whose shutdown ends in-flight requests cleanly (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, grace_s: float):
        super().__init__(config)
        self.grace_s = grace_s

    async def shutdown(self, sockets=None) -> None:
        srv = getattr(getattr(self.config.app, "state", None), "server", None)
        if srv is not None:
            srv.begin_shutdown(self.grace_s)        # new requests: 503; in flight: a deadline
        await super().shutdown(sockets)
