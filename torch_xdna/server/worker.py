"""The device worker: ONE thread owns the NPU; requests queue for it, bounded.

The NPU is a single-tenant device and switching designs costs milliseconds, so the server never
lets two requests interleave on it. Embedding jobs for the same model that wait in the queue are
merged into one engine call (fewer, fuller batches); each job still gets exactly its own rows.
Concurrent clients in a closed loop resubmit a few ms after their shared step ends, so the queue
is empty at the instant the next step starts: with a gather window (`gather_s`, bounded) the worker
waits for up to as many jobs of that key as were in flight at the end of its last step (the step's
jobs plus those queued meanwhile: `_peak`), so a lone client never waits and concurrent ones keep
merging.
When the queue is full, `submit` refuses at once (QueueFull -> HTTP 429) instead of letting
latency grow without bound.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger("torch_xdna.server")


class QueueFull(Exception):
    """The device queue holds max_queue waiting jobs."""


class WorkerStopped(Exception):
    """The worker is shutting down."""


@dataclass(eq=False)
class Job:
    """A unit of device work. Jobs with the same batch_key may be merged: batch_fn receives the
    payloads of all merged jobs and returns one result per payload, in order."""

    fn: Callable[[], Any] | None = None
    batch_key: tuple | None = None
    batch_fn: Callable[[list[Any]], list[Any]] | None = None
    payload: Any = None
    size: int = 1                                   # items in payload (merge budget)
    future: Future = field(default_factory=Future)


def unmerge(sizes: list[int], *rows: Any) -> list[tuple]:
    """A merged batch_fn's per-job share: for each payload (its item count in `sizes`, in order),
    the slices of every `rows` sequence computed over the concatenated items."""
    out, i = [], 0
    for n in sizes:
        out.append(tuple(r[i:i + n] for r in rows))
        i += n
    return out


class DeviceWorker:
    """A single thread running jobs in arrival order."""

    def __init__(self, max_queue: int = 64, max_merge: int = 256, name: str = "xdna-device",
                 gather_s: float = 0.0):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1 (got {max_queue})")
        if not 0.0 <= gather_s <= 1.0:
            raise ValueError(f"gather window must be 0-1000 ms (got {gather_s * 1e3:g} ms)")
        self.max_queue, self.max_merge, self.gather_s = max_queue, max_merge, gather_s
        self._peak: dict[tuple, int] = {}      # batch_key -> jobs in flight after its last step
        self.steps = 0                          # device steps (one job or one merged group)
        self.gather_waits_s = 0.0               # time spent in gather windows
        self._q: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._held: collections.deque[Job] = collections.deque()   # taken out while merging
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._stopping = False
        self.busy = False
        self.jobs_run = 0
        self.merged_jobs = 0

    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Finish the running job, fail the waiting ones, and end the thread."""
        self._stopping = True
        self.fail_pending()
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout)

    def fail_pending(self) -> None:
        """Fail every job still waiting (WorkerStopped); the running one goes on. New jobs are
        still accepted unless stop() was called."""
        pending = list(self._held)
        self._held.clear()
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                pending.append(job)
        for job in pending:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(WorkerStopped("server is shutting down"))

    @property
    def depth(self) -> int:
        """Jobs waiting (not counting the running one)."""
        return self._q.qsize() + len(self._held)

    def submit(self, job: Job) -> Future:
        if self._stopping:
            raise WorkerStopped("server is shutting down")
        try:
            self._q.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"the device queue is full ({self.max_queue} requests waiting)") from None
        return job.future

    def call(self, fn: Callable[[], Any]) -> Future:
        return self.submit(Job(fn=fn))

    # --- the thread --------------------------------------------------------------------------
    def _next(self, block: bool) -> Job | None:
        if self._held:
            return self._held.popleft()
        return self._q.get() if block else self._q.get_nowait()

    def _loop(self) -> None:
        while True:
            job = self._next(block=True)
            if job is None or self._stopping:
                if job is not None and job.future.set_running_or_notify_cancel():
                    job.future.set_exception(WorkerStopped("server is shutting down"))
                if job is None:
                    return
                continue
            if not job.future.set_running_or_notify_cancel():
                continue                                # cancelled while waiting
            self.busy = True
            try:
                if job.batch_key is not None:
                    self._run_merged(job)
                else:
                    self._run_one(job)
            finally:
                self.busy = False
                job = None          # a finished job (and what its closure holds) is not kept
                                    # alive while the thread waits for the next one

    def _run_one(self, job: Job) -> None:
        self.steps += 1
        try:
            result = job.fn() if job.fn is not None else job.batch_fn([job.payload])[0]
        except BaseException as e:          # noqa: BLE001 - delivered to the waiting request
            job.future.set_exception(e)
        else:
            job.future.set_result(result)
        self.jobs_run += 1

    def _run_merged(self, first: Job) -> None:
        key = first.batch_key
        group, size, skipped = [first], first.size, []
        target = self._peak.get(key, 1)          # jobs that shared this key's recent steps
        t0 = time.monotonic()
        deadline = t0 + self.gather_s
        while size < self.max_merge:
            try:
                wait = deadline - time.monotonic()
                if self._held or len(group) >= target or wait <= 0:
                    nxt = self._q.get_nowait()
                else:                             # gather window: more are on their way
                    nxt = self._q.get(timeout=wait)
            except queue.Empty:
                break
            if nxt is None:
                skipped.append(nxt)
                break
            if nxt.batch_key == key and size + nxt.size <= self.max_merge:
                if nxt.future.set_running_or_notify_cancel():
                    group.append(nxt)
                    size += nxt.size
            else:
                skipped.append(nxt)
                if nxt.batch_key != key:
                    break                            # keep arrival order for other work
        self.gather_waits_s += time.monotonic() - t0
        self._held.extend(skipped)
        try:
            self._run_group(group)
        finally:
            self._peak[key] = len(group) + self._q.qsize() + len(self._held)

    def _run_group(self, group: list[Job]) -> None:
        first = group[0]
        if len(group) == 1:
            self._run_one(first)
            return
        self.steps += 1
        try:
            results = first.batch_fn([j.payload for j in group])
        except BaseException:                # noqa: BLE001 - isolate the failing job
            log.warning("merged batch of %d jobs failed; retrying them one by one", len(group))
            self.steps -= 1                          # each retry counts its own step
            for j in group:
                self._run_one(j)
            return
        for j, r in zip(group, results):
            j.future.set_result(r)
        self.jobs_run += len(group)
        self.merged_jobs += len(group) - 1
