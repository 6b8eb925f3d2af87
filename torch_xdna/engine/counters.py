"""Device counter deltas: what a stretch of engine work cost on the device.

Every engine job reports the modeled NPU time, dispatches, launches and DRAM bytes of what it ran
(a prefill, one decode step, a batch of embeddings): the difference of the device's cumulative
counters between two points, taken here once for all of them.
"""
from __future__ import annotations

from torch_xdna.runtime import Device


class CounterDelta:
    """Deltas of the device counters between two points: take() returns them since the last
    take() (or creation) and starts the next interval."""

    FIELDS = ("modeled_us", "dispatches", "launches", "dram_bytes")

    def __init__(self, dev: Device):
        self.dev = dev
        self.start = self._now()

    def _now(self) -> tuple:
        c = self.dev.counters
        return tuple(getattr(c, f) for f in self.FIELDS)

    def take(self) -> dict:
        now = self._now()
        d = {f: b - a for f, a, b in zip(self.FIELDS, self.start, now)}
        self.start = now
        return d
