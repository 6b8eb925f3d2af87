"""Who holds device memory: every live buffer's size and allocating callers, and the buffers freed
whose host memory something still references.

The byte counters only see alloc and free. A buffer freed while a view of its host bytes is kept
somewhere (a cache keyed by address, a stale launch) is gone from the counters but not from the
process: on XDNA a BO is system DRAM, so that is a leak the counters cannot show. The ledger
watches each explicitly freed buffer's host storage through a weak reference and reports those
still alive, by origin (`xdna serve`'s /debug/memory and /metrics read this).

Origins are the code objects of the first callers outside the runtime (and the torch device's
storage glue), kept as references and formatted only when a report is asked for, so allocation
stays cheap on the eager hot path.
"""
from __future__ import annotations

import collections
import os
import sys

from torch.multiprocessing.reductions import StorageWeakRef

ORIGIN_FRAMES = 2                 # callers kept per buffer (allocator helper, its caller)
_RUNTIME = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_RUNTIME)
_STORAGE = os.path.join(_PACKAGE, "device", "storage.py")


def caller_origin() -> tuple:
    """The code objects of the first ORIGIN_FRAMES callers outside the runtime."""
    f = sys._getframe(1)
    out: list = []
    while f is not None and len(out) < ORIGIN_FRAMES:
        name = f.f_code.co_filename
        if not (name.startswith(_RUNTIME) or name == _STORAGE):
            out.append(f.f_code)
        f = f.f_back
    return tuple(out)


def describe(origin: tuple) -> str:
    """'engine/llm/kv_cache.py:KVCache.allocate <- engine/llm/batching.py:BatchSession.__init__'."""
    parts = []
    for code in origin:
        path = code.co_filename
        path = os.path.relpath(path, _PACKAGE) if path.startswith(_PACKAGE) else os.path.basename(path)
        parts.append(f"{path}:{getattr(code, 'co_qualname', code.co_name)}")
    return " <- ".join(parts) or "unknown"


class MemoryLedger:
    """Live buffers (id -> bytes, origin) and watched freed ones. The Device calls it under its
    lock; nothing here holds a buffer or its memory."""

    SWEEP_AT = 256                 # freed entries kept before dead ones are dropped

    def __init__(self) -> None:
        self.live: dict[int, tuple[int, tuple]] = {}
        self._freed: list[tuple[StorageWeakRef, int, int, tuple]] = []
        self._sweep_at = self.SWEEP_AT

    def __contains__(self, buf_id: int) -> bool:
        return buf_id in self.live

    def __len__(self) -> int:
        return len(self.live)

    def add(self, buf_id: int, nbytes: int, origin: tuple) -> None:
        self.live[buf_id] = (nbytes, origin)

    def remove(self, buf_id: int) -> bool:
        return self.live.pop(buf_id, None) is not None

    def watch(self, buf_id: int, nbytes: int, origin: tuple, host) -> None:
        """Follow the host storage of an explicitly freed buffer (before the backend drops it):
        once nothing else references it, it disappears from `retained`."""
        if host is None or host.numel() == 0:
            return
        self._freed.append((StorageWeakRef(host.untyped_storage()), buf_id, nbytes, origin))
        if len(self._freed) >= self._sweep_at:
            self._sweep()
            self._sweep_at = max(self.SWEEP_AT, 2 * len(self._freed))

    def _sweep(self) -> None:
        self._freed = [e for e in self._freed if not e[0].expired()]

    def retained(self) -> list[tuple[int, int, tuple]]:
        """(id, bytes, origin) of freed buffers whose host memory is still referenced."""
        self._sweep()
        return [(i, n, o) for _, i, n, o in self._freed]

    def report(self, top: int = 10) -> dict:
        """Live buffers and bytes, the largest origins and buffers, and the freed-but-retained."""
        live = [(i, n, o) for i, (n, o) in self.live.items()]
        kept = self.retained()
        return {"live_buffers": len(live), "live_bytes": sum(n for _, n, _ in live),
                "by_origin": _by_origin(live, top),
                "largest": [{"id": i, "bytes": n, "origin": describe(o)}
                            for i, n, o in sorted(live, key=lambda e: -e[1])[:top]],
                "retained_after_free": {"buffers": len(kept), "bytes": sum(n for _, n, _ in kept),
                                        "by_origin": _by_origin(kept, top)}}


def _by_origin(rows: list[tuple[int, int, tuple]], top: int) -> list[dict]:
    count: collections.Counter = collections.Counter()
    size: collections.Counter = collections.Counter()
    for _, n, o in rows:
        count[o] += 1
        size[o] += n
    return [{"origin": describe(o), "buffers": count[o], "bytes": b}
            for o, b in size.most_common(top)]
