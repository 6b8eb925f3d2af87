"""How many host threads the simulator's functional execution of one launch uses.

A launch's reference is a few dozen host ops. For a small launch (one short sentence: a [16, 384]
x [384, 1536] GEMM) intra-op threads only add OpenMP fork/join and barrier waits, and on a busy
host a barrier waits for a descheduled thread: measured on this 2-core host under load, one
12-token embedding took 995 ms at 2 threads and 139 ms at 1. So a launch below SMALL_LAUNCH_MACS
runs on one thread; larger launches keep the process's setting (torch.set_num_threads).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

SMALL_LAUNCH_MACS = 250_000_000      # ~ a 200-token encoder FFN block (2 x 200 x 384 x 1536)


@contextlib.contextmanager
def launch_threads(macs: int) -> Iterator[None]:
    """One intra-op thread for a launch of fewer than SMALL_LAUNCH_MACS multiply-accumulates."""
    threads = torch.get_num_threads()
    if threads == 1 or macs >= SMALL_LAUNCH_MACS:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
