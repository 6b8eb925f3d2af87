"""The device worker's gather window: concurrent closed-loop clients keep sharing device steps,
a lone client never waits, and the wait is bounded (server/worker.py)."""
from __future__ import annotations

import threading
import time

import pytest

from torch_xdna.server.worker import DeviceWorker, Job

STEP_S = 0.03           # a device step's duration in the fake batch function


def _closed_loop(w: DeviceWorker, clients: int, requests: int, think_s: float) -> list[int]:
    """`clients` threads each send `requests` jobs one after another (answer, think, resend);
    returns the group size each step ran."""
    groups: list[int] = []

    def step(payloads):
        groups.append(len(payloads))
        time.sleep(STEP_S)
        return [p * 2 for p in payloads]

    def client(c: int) -> None:
        for i in range(requests):
            f = w.submit(Job(batch_key=("embed", "m"), batch_fn=step, payload=c * 100 + i))
            assert f.result(10) == 2 * (c * 100 + i)          # its own answer
            time.sleep(think_s)                               # HTTP round trip, tokenization

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return groups


@pytest.mark.parametrize("gather_s", [0.0, 0.02])
def test_concurrent_clients_merge_and_a_lone_client_never_waits(gather_s):
    w = DeviceWorker(gather_s=gather_s)
    w.start()
    try:
        groups = _closed_loop(w, 4, 6, think_s=0.004)
        assert sum(groups) == 24 and w.jobs_run == 24 and w.steps == len(groups)
        if gather_s:
            # clients fall into step with each other: most steps carry all four. A client that
            # missed the first step stays one behind and its last request runs alone, so the
            # bound is on the count of steps and the typical step, not on every step.
            assert len(groups) <= 6 + 2, groups
            assert sorted(groups)[len(groups) // 2] == 4, groups
        waited = w.gather_waits_s
        alone = _closed_loop(w, 1, 5, think_s=0.004)
        assert alone == [1] * 5
        # a lone client pays at most one window (the first step after the concurrent ones)
        assert w.gather_waits_s - waited <= gather_s + 0.05
    finally:
        w.stop()


def test_gather_window_is_bounded_and_validated():
    with pytest.raises(ValueError, match="gather window"):
        DeviceWorker(gather_s=5.0)
    w = DeviceWorker(gather_s=0.05)
    w.start()
    try:
        w._peak[("embed", "m")] = 4                 # it expects 4, only 1 comes
        t0 = time.monotonic()
        f = w.submit(Job(batch_key=("embed", "m"), batch_fn=lambda ps: ps, payload=1))
        assert f.result(5) == 1
        assert time.monotonic() - t0 < 0.05 + 0.5
        other = w.submit(Job(fn=lambda: "other"))   # other work is never held back by a window
        assert other.result(5) == "other"
    finally:
        w.stop()
