"""Server chats through continuous batching (engine/llm/batching.py's BatchRunner).

A chat or completion for a resident decoder model that the batch can serve does not take a
device job of its own: its request thread submits it to the model's BatchRunner and consumes
its Handle; one device job (`drive`) decodes every such generation together, admitting new ones
between steps, until none is left. It yields to other device work: once a job waits in the
device queue, no generation is admitted; the batch drains, the waiting job runs, and the drive
is queued again behind it. Slots are sized from the memory free when a drive starts
(slots_for_budget, at most --max-batch); when none fits, the queue is served one by one.

`batch_refusal` is the one routing policy: what it refuses (the single-sequence path) is what a
batch session cannot do (logprobs, grammars and forced tool calls, penalties, n > 1, int8 KV).
Each sequence's tokens equal its tokens decoded alone (tests/test_server_batching.py).
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Iterator

from torch_xdna.server.chat import GenerationParams, Piece
from torch_xdna.server.errors import shutting_down
from torch_xdna.server.schemas import APIError
from torch_xdna.server.worker import Job

log = logging.getLogger("torch_xdna.server")

def batch_refusal(model: Any, params: GenerationParams, max_batch: int) -> str | None:
    """Why this request runs on the single-sequence path (None: it joins the batch)."""
    if max_batch <= 1:
        return "off"
    engine = getattr(model, "engine", None)
    if engine is None or not hasattr(model, "generation_config") or not hasattr(engine, "decoder"):
        return "model"                          # not the decoder engine (a fake, a script)
    from torch_xdna.engine.llm.batching import unsupported
    return unsupported(engine, model.generation_config(params))


class HandleSource:
    """A ChatModel view of one submitted generation: stream() yields its Pieces (run_generation
    drives it exactly as it drives the model itself)."""

    def __init__(self, model: Any, handle):
        self.model, self.handle = model, handle
        self.features = getattr(model, "features", ())

    def stream(self, prompt_ids, params, cancelled) -> Iterator[Piece]:
        from torch_xdna.engine.llm.batching import text_chunks
        return self.model.pieces(text_chunks(self.model.engine, self.handle, cancelled),
                                 params.stops_here)


class Batcher:
    """One BatchRunner per resident chat model; schedules their drive jobs on the worker."""

    def __init__(self, srv, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 (got {max_batch})")
        self.srv, self.max_batch = srv, max_batch
        self._runners: dict[str, tuple[Any, Any]] = {}     # entry id -> (model, runner)
        self._lock = threading.Lock()
        self.routed: collections.Counter = collections.Counter()   # "batch" or refusal reason
        m = srv.metrics
        m.gauge("xdna_batch_sequences", "sequences decoding in batched steps now",
                lambda: sum(r.active for _, r in list(self._runners.values())))
        m.gauge("xdna_batch_largest", "largest batched step so far",
                lambda: max((r.max_batch for _, r in list(self._runners.values())), default=0))
        m.gauge("xdna_batch_requests", "chat requests routed through the batch so far",
                lambda: self.routed["batch"])

    def accepts(self, model: Any, params: GenerationParams) -> bool:
        why = batch_refusal(model, params, self.max_batch)
        self.routed[why or "batch"] += 1
        return why is None

    def runner(self, entry_id: str, model: Any):
        from torch_xdna.engine.llm.batching import BatchRunner, slots_for_budget
        with self._lock:
            loaded = self.srv.registry.loaded
            for k in [k for k, (m, r) in self._runners.items()      # evicted: let them go
                      if loaded.get(k) is not m and not r._driving]:
                del self._runners[k]
            held = self._runners.get(entry_id)
            if held is None or held[0] is not model:        # first use, or the model reloaded
                engine = model.engine
                runner = BatchRunner(engine, lambda: slots_for_budget(engine, self.max_batch),
                                     yield_to=lambda: self.srv.worker.depth > 0)
                held = self._runners[entry_id] = (model, runner)
            return held[1]

    def submit(self, entry_id: str, model: Any, ids: list[int], config):
        """Queue one generation (request thread); its Handle. 429 when max_queue are waiting."""
        runner = self.runner(entry_id, model)
        if runner.queued >= self.srv.config.max_queue:
            self.srv.metrics.reject("queue_full")
            raise APIError(429, f"the batch queue of '{entry_id}' is full "
                                f"({self.srv.config.max_queue} requests waiting); retry shortly "
                                f"or raise --max-queue.", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        handle, start = runner.submit(ids, config)
        if start:
            self._schedule(entry_id, model, runner, raise_=True)
        return handle

    def _schedule(self, entry_id: str, model: Any, runner, raise_: bool = False) -> None:
        """Queue a drive job for `runner` (request thread, or the device thread re-queuing)."""
        srv, ran = self.srv, []

        def drive() -> None:
            ran.append(True)
            if srv.registry.loaded.get(entry_id) is not model:     # evicted while queued
                runner.fail_pending(APIError(503, f"the model '{entry_id}' was unloaded while "
                                                  f"the request waited; retry it.",
                                             type="server_error", code="model_unloaded"))
                return
            srv.registry.get(srv.registry.entries[entry_id])       # most recently used now
            if runner.drive():              # yielded to waiting jobs: go behind them
                self._schedule(entry_id, model, runner)

        def never_ran(fut) -> None:
            if not ran:                     # dropped at shutdown: end the queued requests
                runner.fail_pending(shutting_down())
            elif not fut.cancelled() and fut.exception() is not None:
                log.error("batched decode failed", exc_info=fut.exception())

        try:
            fut = srv.submit(Job(fn=srv.npu_job(drive)))
        except APIError as e:               # device queue full, or shutting down
            runner.fail_pending(e)
            if raise_:
                raise
            return
        fut.add_done_callback(never_ran)
