"""`xdna info`: which device, backend and NPU generation is in use, with the key limits."""
from __future__ import annotations

import argparse
import json


def collect() -> dict:
    import torch

    import torch_xdna
    from torch_xdna.runtime import get_device
    dev = get_device()
    g = dev.gen
    return {
        "torch_xdna": torch_xdna.__version__,
        "torch": torch.__version__,
        "backend": dev.backend,
        "simulated": dev.backend == "sim",
        "device": dev.properties()["name"],
        "generation": g.name,
        "arch": g.arch,
        "array": f"{g.columns.value} columns x {g.core_rows.value} rows = {g.cores} cores",
        "l1_bytes_per_core": g.l1_bytes.value,
        "memtile_bytes": g.memtile_bytes.value,
        "hw_contexts": g.hw_contexts.value,
        "memory_budget_bytes": dev.memory_budget,
        "peak_tops": {dt: round(g.peak_ops(dt) / 1e12, 2) for dt in g.macs_per_core_cycle.value},
    }


def run(args: argparse.Namespace) -> int:
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for k, v in info.items():
        print(f"{k:<{width}}  {v}")
    if info["simulated"]:
        print("\nBackend 'sim': a simulated XDNA2 array. Costs are modeled, not measured on an NPU. "
              "`xdna doctor` checks whether this machine can use a real NPU.")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="show the device, backend and NPU generation in use",
                       description="Show the device, backend (sim or xrt) and NPU generation.")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)
