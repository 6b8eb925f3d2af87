"""What the job commands (embed, rerank, transcribe, ...) print about the NPU, in one wording:
which backend ran, whether its time is modeled (simulator) or measured, and the cost summary
line / JSON object of an embedding-style run (EmbedStats)."""
from __future__ import annotations

from typing import Any


def npu_timing(dev: Any) -> str:
    """"modeled" on the simulator, "measured" on hardware."""
    return "modeled" if dev.backend == "sim" else "measured"


def backend_label(dev: Any) -> str:
    return "simulated NPU" if dev.backend == "sim" else f"{dev.backend} NPU"


def npu_json(stats: Any, dev: Any) -> dict:
    """The "npu" object of a --json answer: dispatches, NPU ms (keyed modeled_ms / measured_ms),
    host ms."""
    return {"dispatches": stats.dispatches, f"{npu_timing(dev)}_ms": stats.modeled_us / 1e3,
            "host_ms": stats.host_s * 1e3}


def cost_line(name: str, dev: Any, counts: str, stats: Any) -> str:
    """`NAME on BACKEND: COUNTS, N dispatch(es), NPU time X ms (modeled), host Y ms`."""
    return (f"{name} on {backend_label(dev)}: {counts}, {stats.dispatches} dispatch(es), NPU time "
            f"{stats.modeled_us / 1e3:.2f} ms ({npu_timing(dev)}), host "
            f"{stats.host_s * 1e3:.0f} ms")
