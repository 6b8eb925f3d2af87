"""What the server is doing, for operators and load balancers: /health (backend, models, queue),
/metrics (Prometheus, through prometheus-client) and /debug/memory (who holds memory: the
largest live device buffers by origin, freed buffers still referenced, host-side caches)."""
from __future__ import annotations

from fastapi import FastAPI, Query
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from torch_xdna.server.metrics import CONTENT_TYPE, process_stats
from torch_xdna.server.state import Server, backend_description


def host_caches(srv: Server) -> dict[str, int]:
    """Bytes of the bounded host-side caches: the simulator's operand copies and KV mirrors
    (sim speed only) and each resident model's prefix cache."""
    from torch_xdna.kernels.blocks.operands import KV_MIRROR, OPERANDS
    out = {"sim_operands": OPERANDS.bytes, "sim_kv_mirror": KV_MIRROR.bytes}
    for name, model in list(srv.registry.loaded.items()):
        pc = getattr(getattr(model, "engine", None), "prefix_cache", None)
        if pc is not None:
            out[f"prefix_cache:{name}"] = pc.bytes
    return out


def memory_snapshot(srv: Server, top: int = 10) -> dict:
    """Process figures, the device's memory report (runtime/memory.py) and the host caches."""
    return {"process": process_stats(), "device": srv.dev.memory_report(top),
            "host_caches": host_caches(srv)}


def register(app: FastAPI, srv: Server) -> None:
    """Add /health, /metrics and /debug/memory to `app`, and the memory gauges to the metrics."""
    m, dev = srv.metrics, srv.dev
    m.gauge("xdna_device_live_buffers", "device buffers allocated and not freed",
            lambda: dev.live_buffers)
    m.gauge("xdna_device_retained_freed_bytes", "bytes of freed device buffers whose host "
            "memory is still referenced (should be 0; see /debug/memory)",
            lambda: dev.memory_report(0)["retained_after_free"]["bytes"])
    m.gauge("xdna_host_cache_bytes", "bytes held by bounded host-side caches (simulator "
            "operand copies and KV mirrors, prefix caches)", lambda: sum(host_caches(srv).values()))

    @app.get("/health")
    async def health():
        return {"status": "ok", "backend": srv.dev.backend,
                "backend_description": backend_description(srv.dev),
                "generation": srv.dev.gen.name,
                "models": list(srv.registry.entries), "resident": srv.registry.loaded_ids(),
                "queue_depth": srv.worker.depth, "max_queue": srv.config.max_queue}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(await run_in_threadpool(srv.metrics.render),
                                 media_type=CONTENT_TYPE)

    @app.get("/debug/memory")
    async def debug_memory(top: int = Query(10, ge=1, le=1000)):
        return await run_in_threadpool(memory_snapshot, srv, top)
