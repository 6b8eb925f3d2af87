"""The server's shared state (Server): device, model registry, device worker, batcher, metrics,
and the generations in flight that shutdown must end; plus the per-generation stop flag (Cancel).
Routes reach the device only through Server.submit/wait/load/npu_job."""
from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable

from fastapi import Request

from torch_xdna.runtime import DeviceOutOfMemory, get_device
from torch_xdna.server.batching import Batcher
from torch_xdna.server.config import ServerConfig, parse_model_arg
from torch_xdna.server.errors import ModelLoadFailed, client_gone, shutting_down
from torch_xdna.server.metrics import Metrics
from torch_xdna.server.registry import ModelEntry, ModelRegistry, load_failure
from torch_xdna.server.schemas import APIError
from torch_xdna.server.worker import DeviceWorker, Job, QueueFull, WorkerStopped

log = logging.getLogger("torch_xdna.server")


def backend_description(dev) -> str:
    if dev.backend == "sim":
        return f"simulated NPU ({dev.gen.name}; timings are modeled, not measured)"
    return f"{dev.backend} NPU ({dev.gen.name})"


async def until_disconnected(request: Request) -> None:
    """Returns when the client has gone away. The body has been read by then, so the next ASGI
    message can only be http.disconnect (uvicorn also sends it once the response is complete;
    callers cancel this first)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


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


class Server:
    """State shared by the routes: device, registry, worker, metrics."""

    def __init__(self, config: ServerConfig, registry: ModelRegistry | None = None):
        self.config = config
        self.metrics = Metrics()
        self.dev = get_device()
        self.registry = registry or ModelRegistry(config.max_models, config.max_context,
                                                   config.kv_dtype, config.precision,
                                                   config.precision_budget, config.prefill_chunk)
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
        for spec in config.aliases:
            alias, sep, target = spec.partition("=")
            if not (sep and alias and target):
                raise ValueError(f"--alias {spec!r}: write it as ALIAS=MODEL")
            self.registry.add_alias(alias, target)
        if not self.registry.entries:
            raise ValueError("no models to serve: give --model DIR or keep the default model")
        self.worker = DeviceWorker(config.max_queue, gather_s=config.gather_ms / 1e3)
        if hasattr(self.dev, "set_host_lanes"):   # sim: a merged step's batches use the cores
            from torch_xdna.runtime.sim.lanes import default_host_lanes
            self.dev.set_host_lanes(config.host_threads or default_host_lanes())
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
        the client learns which model, why (without server paths) and what to do."""
        try:
            return self.registry.get(entry)
        except DeviceOutOfMemory:
            raise
        except Exception as e:
            log.error("loading model %r failed: %s: %s", entry.id, type(e).__name__, e)
            raise ModelLoadFailed(entry.id, load_failure(entry.id, e)) from e

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
