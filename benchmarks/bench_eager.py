"""Eager overhead and simulated GEMM throughput, each against a peer measured in the same run.

- per-op host overhead of small eager ops on 'xdna' vs the same ops on the CPU (us/op, measured);
- GEMM: modeled NPU throughput (simulator) next to torch CPU throughput measured on this host,
  and the host wall time the simulator spends executing the GEMM reference.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import torch_xdna  # noqa: F401
from torch_xdna.runtime import get_device


def _time(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def per_op_overhead(reps: int) -> list[dict]:
    rows = []
    a_cpu, b_cpu = torch.randn(64, 64), torch.randn(64, 64)
    a_x, b_x = a_cpu.to("xdna"), b_cpu.to("xdna")
    ops = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "relu": lambda a, b: torch.relu(a),
           "mm 64x64": lambda a, b: a @ b, "softmax": lambda a, b: torch.softmax(a, -1)}
    for name, fn in ops.items():
        t_cpu = _time(lambda: fn(a_cpu, b_cpu), reps)
        t_x = _time(lambda: fn(a_x, b_x), reps)
        rows.append({"op": name, "cpu_us": round(t_cpu * 1e6, 2), "xdna_host_us": round(t_x * 1e6, 2),
                     "ratio_xdna_over_cpu": round(t_x / t_cpu, 1)})
    return rows


def gemm_throughput(sizes: list[int], reps: int) -> list[dict]:
    dev = get_device()
    rows = []
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        ax, bx = a.to("xdna"), b.to("xdna")
        t_cpu = _time(lambda: a @ b, reps)
        (ax @ bx)                                    # warm: plan cached, design configured
        before = dev.counters.modeled_us
        t_host = _time(lambda: ax @ bx, reps)
        modeled_us = (dev.counters.modeled_us - before) / (reps + 1)
        flops = 2 * n ** 3
        rows.append({"n": n, "cpu_gflops_measured": round(flops / t_cpu / 1e9, 1),
                     "npu_gflops_modeled": round(flops / (modeled_us * 1e-6) / 1e9, 1),
                     "ratio_modeled_npu_over_cpu": round(t_cpu / (modeled_us * 1e-6), 2),
                     "sim_host_ms_per_gemm": round(t_host * 1e3, 2)})
    return rows


def run(quick: bool = True) -> dict:
    reps = 20 if quick else 200
    sizes = [256, 1024] if quick else [256, 512, 1024, 2048]
    return {"benchmark": "eager", "backend": get_device().backend,
            "note": "xdna/cpu us per op are measured host overheads; npu_gflops is modeled by the "
                    "simulator (dispatch included), cpu_gflops measured on this host",
            "per_op": per_op_overhead(reps), "gemm": gemm_throughput(sizes, max(3, reps // 10))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--json", action="store_true")
    r = run(quick=not ap.parse_args().full)
    print(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
