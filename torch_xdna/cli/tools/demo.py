"""`xdna demo`: run a small model on the (simulated) NPU, check it against the CPU, print cost."""
from __future__ import annotations

import argparse
import json
import time

from torch_xdna.cli.args import positive_int


def run_demo(batch: int = 8, hidden: int = 256, layers: int = 4) -> dict:
    import torch

    import torch_xdna  # noqa: F401
    from torch_xdna.runtime import get_device
    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(hidden, 4 * hidden), torch.nn.GELU(),
                   torch.nn.Linear(4 * hidden, hidden), torch.nn.LayerNorm(hidden)]
    model = torch.nn.Sequential(*blocks).eval()
    x = torch.randn(batch, hidden)
    with torch.inference_mode():
        ref = model(x)
    model = model.to("xdna")
    dev = get_device()
    dev.reset_counters()
    fallbacks_before = sum(torch.xdna.fallback_report().values())   # the report is process-wide
    t0 = time.perf_counter()
    with torch.inference_mode(), torch.xdna.strict():
        out = model(x.to("xdna")).cpu()
    wall = time.perf_counter() - t0
    c = dev.counters
    return {
        "model": f"{layers}x [Linear({hidden},{4 * hidden}) GELU Linear LayerNorm], batch {batch}",
        "backend": dev.backend,
        "max_abs_diff_vs_cpu": float((out - ref).abs().max()),
        "launches": c.launches,
        "dispatches": c.dispatches,
        "modeled_npu_us": round(c.modeled_us, 1),
        "dram_bytes": c.dram_bytes,
        "host_wall_ms": round(wall * 1e3, 2),
        "host_fallbacks": sum(torch.xdna.fallback_report().values()) - fallbacks_before,
    }


def run(args: argparse.Namespace) -> int:
    r = run_demo(args.batch, args.hidden, args.layers)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    kind = "modeled by the simulator" if r["backend"] == "sim" else "measured on the NPU"
    print(f"model: {r['model']}")
    print(f"backend: {r['backend']}   max |xdna - cpu| = {r['max_abs_diff_vs_cpu']:.2e} "
          f"(bf16 operands, fp32 accumulation)")
    print(f"launches: {r['launches']}   dispatches: {r['dispatches']}   "
          f"host fallbacks: {r['host_fallbacks']}")
    print(f"NPU time ({kind}): {r['modeled_npu_us'] / 1e3:.3f} ms   DRAM traffic: "
          f"{r['dram_bytes'] / 1e6:.2f} MB   host wall time: {r['host_wall_ms']} ms")
    print("eager mode pays one dispatch per op; torch.compile(backend='xdna') fuses them.")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a small model on the (simulated) NPU and print its cost",
                       description="Run an MLP stack on the xdna device in strict mode, compare "
                                   "with the CPU, and print launches and modeled NPU time.")
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--hidden", type=positive_int, default=256)
    p.add_argument("--layers", type=positive_int, default=4)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)
