"""`xdna profile`: run a small built-in workload on the runtime and show where NPU time goes.

The workload is an MLP per --shape M K N: up = gelu(x @ W1 + b1) [M, N], then
down = up @ W2 + b2 + x [M, K], run once as separate launches (eager) and once as one chained
program, straight on the runtime (no torch device needed). On the simulator every figure is
modeled by the cost model and labelled so.
"""
from __future__ import annotations

import argparse
import json

from torch_xdna.cli.args import positive_int

DEFAULT_SHAPES = ((64, 512, 2048),)
WEIGHT_GROUP = 32


def run_workload(shapes, dtype: str = "bf16", device=None):
    """Run the MLP workload under the profiler; returns the Profile."""
    import torch

    from torch_xdna.kernels.ops.gemm import GemmDesign
    from torch_xdna.runtime import Launch, Program, get_device
    from torch_xdna.runtime.profiler import profile

    dev = device or get_device()
    gen = torch.Generator().manual_seed(0)
    buffers = []
    with profile(dev) as prof:
        for m, k, n in shapes:
            x = dev.upload(torch.randn(m, k, generator=gen))
            w1, g1 = _weight(dev, torch.randn(k, n, generator=gen) / k ** 0.5, dtype)
            w2, g2 = _weight(dev, torch.randn(n, k, generator=gen) / n ** 0.5, dtype)
            b1, b2 = dev.upload(torch.zeros(n)), dev.upload(torch.zeros(k))
            h, y = dev.empty((m, n), torch.float32), dev.empty((m, k), torch.float32)
            buffers += [x, *w1, b1, *w2, b2, h, y]
            up = Launch(GemmDesign(m, k, n, dtype=dtype, bias=True, epilogue="gelu", w_group=g1),
                        [x, *w1, b1], [h], op=f"mlp.up {m}x{k}x{n}")
            down = Launch(GemmDesign(m, n, k, dtype=dtype, bias=True, residual=True, w_group=g2),
                          [h, *w2, b2, x], [y], op=f"mlp.down {m}x{n}x{k}")
            dev.run(up)                                   # eager: one dispatch each
            dev.run(down)
            dev.run_program(Program([up, down], name="mlp"))   # chained: one dispatch
        dev.synchronize()
    for b in buffers:
        dev.free(b.buffer)
    return prof


def _weight(dev, w, dtype: str):
    """A [K, N] weight as launch arguments: float for bf16/bfp16; for int8/int4 quantized
    [N, K] with group scales (weight-only), returning (args, group size)."""
    from torch_xdna.kernels import quant
    if dtype not in ("int8", "int4"):
        return [dev.upload(w)], 0
    k = w.shape[0]
    group = WEIGHT_GROUP if k % WEIGHT_GROUP == 0 else k
    q, scales = (quant.quantize_int4 if dtype == "int4" else quant.quantize_int8)(w.t(), group)
    return [dev.upload(q), dev.upload(scales)], group


def run(args: argparse.Namespace) -> int:
    shapes = [tuple(s) for s in args.shape] if args.shape else list(DEFAULT_SHAPES)
    prof = run_workload(shapes, args.dtype)      # a PlanError names the limit (cli/main.py)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    if args.json:
        print(json.dumps(prof.to_json(), indent=2))
    else:
        print(f"workload: MLP {', '.join('x'.join(map(str, s)) for s in shapes)} [{args.dtype}], "
              f"eager then as one chained program")
        print(prof.format_table())
        if args.trace:
            print(f"\nChrome/Perfetto trace written to {args.trace} (times {prof.label})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from torch_xdna.kernels.numerics_plan import DTYPES
    p = sub.add_parser("profile", help="profile a small MLP workload (modeled on the simulator)",
                       description="Run a small MLP on the NPU runtime and print per-design and "
                                   "per-op time. On the simulator all times are modeled.")
    p.add_argument("--shape", nargs=3, type=positive_int, action="append", metavar=("M", "K", "N"),
                   help="MLP shape: M tokens, K hidden, N intermediate (repeatable; "
                        "default 64 512 2048)")
    p.add_argument("--dtype", default="bf16", choices=DTYPES,
                   help="GEMM numerics (default bf16; int8/int4 = weight-only, group size 32)")
    p.add_argument("--json", action="store_true", help="print the table and summary as JSON")
    p.add_argument("--trace", metavar="OUT.json", help="also write a Chrome/Perfetto trace")
    p.set_defaults(func=run)
