"""`xdna doctor`: check this machine's NPU stack (kernel, driver, firmware, device node, memlock,
XRT, pyxrt) and print exactly what to fix. Exit status 1 when the NPU cannot be used."""
from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor", help="check the NPU driver/firmware/XRT setup and say what to fix",
        description="Check kernel, amdxdna driver, firmware, /dev/accel/accel0, locked-memory limit, "
                    "XRT, pyxrt and xrt-smi. Exit status 0 when the NPU is usable, 1 otherwise.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--validate", action="store_true",
                   help="also run `xrt-smi validate` on the NPU (about a minute)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, system=None, **doctor_kw) -> int:
    from torch_xdna.cli.npu.doctor_checks import Doctor, format_report

    report = Doctor(system, validate=args.validate, **doctor_kw).run()
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(format_report(report))
    return report.exit_code
