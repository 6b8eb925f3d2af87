"""Host lanes: the simulator's functional execution of independent programs on a few host threads.

Sim speed only. The functional level is CPU-bound (a launch is a few dozen torch ops, which
release the GIL), so one device step that holds several independent programs (an embedding
request merged from several clients: several (batch, seq) Programs) can use more than one core
of the host. Nothing of the modeled NPU changes: the device still charges the programs one after
another in submission order (SimDevice.run_programs), so modeled time, counters and the one-NPU
ordering are those of sequential run_program calls, and each program's numbers are computed by
the same ops on one intra-op thread, so results are bit-identical.
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Sequence

from torch_xdna.runtime.launch import Program


MAX_DEFAULT_LANES = 2     # a merged embedding step rarely holds more than 2-4 similar-size batches


def default_host_lanes() -> int:
    """Host lanes a server uses by default: the host's cores, at most MAX_DEFAULT_LANES."""
    return max(1, min(MAX_DEFAULT_LANES, os.cpu_count() or 1))


def check_independent(programs: Sequence[Program]) -> None:
    """Raise ValueError unless no program writes a buffer that another one reads or writes
    (the condition for running them in any order, or at the same time)."""
    touched: list[tuple[set[int], set[int]]] = []
    for p in programs:
        outs = {a.buffer.id for launch in p.launches for a in launch.outputs}
        ins = {a.buffer.id for launch in p.launches for a in launch.inputs}
        touched.append((outs, ins | outs))
    for i, (outs_i, all_i) in enumerate(touched):
        for j, (outs_j, all_j) in enumerate(touched):
            if i != j and outs_i & all_j:
                raise ValueError(f"run_programs: program {i} ({programs[i].name}) writes a buffer "
                                 f"that program {j} ({programs[j].name}) uses; give each program "
                                 f"its own workspace buffers or run them with run_program")


class HostLanes:
    """A fixed pool of `n` host threads running callables, longest first."""

    def __init__(self, n: int, name: str = "xdna-sim-lane"):
        if n < 1:
            raise ValueError(f"host lanes must be >= 1 (got {n})")
        self.n = n
        self._pool = ThreadPoolExecutor(n, thread_name_prefix=name)

    def run(self, fns: Sequence[Callable[[], None]], weights: Sequence[float]) -> list[BaseException | None]:
        """Run every fn, heaviest first (balances the lanes: longest processing time first);
        returns each fn's exception (None when it succeeded), in the order given."""
        order = sorted(range(len(fns)), key=lambda i: -weights[i])
        futs: dict[int, Future] = {i: self._pool.submit(fns[i]) for i in order}
        return [futs[i].exception() for i in range(len(fns))]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
