"""`xdna info`: which device, backend and NPU generation is in use, with the key limits;
`xdna info --env`: every environment variable torch-xdna reads (runtime/settings.py), its value
now, default, allowed values and meaning -- the one place to see why the package behaves as it does."""
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


def collect_env() -> list[dict]:
    """settings.describe() rows, each with "error" set when the current value would be refused."""
    from torch_xdna.runtime import settings
    rows = settings.describe()
    for row in rows:
        row["error"] = None
        if row["reader"] == "torch_xdna":
            try:
                settings.get(row["name"])
            except settings.EnvError as e:
                row["error"] = str(e)
    return rows


def _env_line(row: dict) -> str:
    now = "(unset)" if row["value"] is None else repr(row["value"])
    d = row["default"]
    default = "" if d is None else f"default {int(d) if isinstance(d, bool) else d}"
    form = (f"one of {', '.join(row['allowed'])}" if row["kind"] == "choice"
            else "1 or 0" if row["kind"] == "flag" else row["unit"] or row["kind"])
    extra = "; ".join(x for x in (default, form, "read by PyTorch" if row["reader"] != "torch_xdna"
                                   else "", "test hook" if row["internal"] else "") if x)
    line = f"{row['name']} = {now}   [{extra}]\n    {row['doc']}"
    return line + (f"\n    INVALID: {row['error']}" if row["error"] else "")


def run_env(args: argparse.Namespace) -> int:
    rows = collect_env()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("\n".join(_env_line(r) for r in rows))
    return 2 if any(r["error"] for r in rows) else 0


def run(args: argparse.Namespace) -> int:
    if args.env:
        return run_env(args)
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
    p.add_argument("--env", action="store_true",
                   help="list every environment variable torch-xdna reads: value, default, allowed "
                        "values, meaning (exit 2 when one holds a value that would be refused)")
    p.set_defaults(func=run)
