"""`xdna conformance`: run PyTorch's OpInfo samples for the supported models' ops on the device
and compare with the CPU (torch_xdna/testing/conformance.py); print per-op pass counts with
fallbacks allowed (default) and on NPU kernels only (strict), and the totals."""
from __future__ import annotations

import argparse
import json

from torch_xdna.cli.args import CliError, add_command

# the targets (issue 14): share of samples that pass
DEFAULT_TARGET = 0.98
STRICT_TARGET = 0.90

EPILOG = """\
examples:
  xdna conformance                        every op in the list, both modes, totals
  xdna conformance --op softmax --op mm   some ops (any OpInfo name works, e.g. "div.no_rounding_mode")
  xdna conformance --strict               also list every sample that needs a host fallback
  xdna conformance --json                 machine-readable, with the failing samples

Results come from the simulator's functional level: each kernel computes with the NPU's
numerics (bf16 operands, fp32 accumulation) on this host. Exit status 1 when a target is missed
(default >= 98% of samples, strict >= 90%; with --strict only the strict one)."""

DTYPES = {"float32", "bfloat16", "float16"}


def register(subparsers) -> None:
    p = add_command(subparsers, "conformance", help="PyTorch's OpInfo samples on xdna vs the CPU",
                    description=__doc__, epilog=EPILOG)
    p.add_argument("--op", action="append", default=[], metavar="NAME",
                   help="an OpInfo name (repeatable; default: the conformance list)")
    p.add_argument("--strict", action="store_true",
                   help="gate on NPU kernels only and list the samples that need a fallback")
    p.add_argument("--max-samples", type=int, default=None, metavar="N",
                   help="samples per op and dtype (default 6)")
    p.add_argument("--dtype", action="append", default=[], choices=sorted(DTYPES),
                   help="float dtype to sample (repeatable; default float32 and bfloat16)")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from torch_xdna.testing import conformance as conf
    try:
        ops = conf.select(args.op)
    except KeyError as e:
        raise CliError(f"{e.args[0]}; see torch.testing._internal.common_methods_invocations.op_db "
                       f"or run without --op for the conformance list") from None
    dtypes = tuple(getattr(torch, d) for d in args.dtype) or conf.DEFAULT_DTYPES
    n = args.max_samples if args.max_samples is not None else conf.DEFAULT_MAX_SAMPLES
    if n < 1:
        raise CliError("--max-samples must be at least 1")
    result = conf.run(ops, dtypes=dtypes, max_samples=n)
    t = result["totals"]
    t["targets"] = {"default": DEFAULT_TARGET, "strict": STRICT_TARGET}
    ok_strict = t["strict_rate"] >= STRICT_TARGET
    ok = ok_strict if args.strict else ok_strict and t["default_rate"] >= DEFAULT_TARGET
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0 if ok else 1
    print(conf.format_table(result))
    shown = [f for f in result["failures"] if args.strict or not f["default_ok"]]
    if shown:
        print("\nfailing samples" + (" (strict: NPU kernels only)" if args.strict else "") + ":")
        for f in shown:
            mode = "strict" if f["default_ok"] else "both"
            fb = f" [fallback: {', '.join(f['fallbacks'])}]" if f["fallbacks"] else ""
            print(f"  {f['op']} {f['dtype']} #{f['index']} ({mode}){fb}: {f['reason'][:150]}")
    print(f"targets: default >= {DEFAULT_TARGET:.0%}, strict >= {STRICT_TARGET:.0%}: "
          f"{'met' if ok else 'MISSED'}")
    return 0 if ok else 1
