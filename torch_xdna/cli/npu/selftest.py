"""`xdna selftest`: run two designs on the physical NPU through the xrt backend and compare them
bit for bit with the simulator's functional level in the core kernels' own accumulation order
(TORCH_XDNA_GEMM_ORDER=kernel, what a correct chip computes), reporting beside it the distance in
ulp to the default (fast) reference; print a receipt. With TORCH_XDNA_XRT=emulated it runs on the
emulated NPU and says so. Anywhere else: "hardware unavailable", exit 2."""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from torch_xdna.cli.args import add_command

# (design, shape): an exact integer check and the bf16 GEMM path (bf16 operands, fp32 accumulation)
CHECKS = (("add_one", "1024"), ("gemm", "64x64x64"))
REFERENCE_ORDER = "kernel"        # the core kernels' own accumulation order (numerics.GEMM_ORDERS)
BUILD_HINT = ("build the artifacts first: xdna kernels build "
              + " ".join(f"--design {d} --shape {s}" for d, s in CHECKS))


def register(subparsers) -> None:
    p = add_command(
        subparsers, "selftest", help="run designs on the NPU and compare bit-exact with the simulator",
        description=__doc__ + "\n\nExit status: 0 all checks bit-exact, 1 a mismatch or a failed "
                              "launch, 2 hardware unavailable (no NPU, no pyxrt, or no artifacts).")
    p.add_argument("--json", action="store_true", help="print the receipt as JSON")
    p.add_argument("--receipt", type=Path, help="also write the JSON receipt to this file")
    p.set_defaults(func=run)


def _unavailable(why: str, args) -> int:
    msg = f"hardware unavailable: {why}"
    if args.json:
        print(json.dumps({"ok": False, "hardware": False, "reason": why}, indent=2))
    else:
        print(f"xdna selftest: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, *, system=None, pyxrt=None, artifacts=None) -> int:
    import torch
    from torch_xdna import __version__
    from torch_xdna.kernels.toolchain import catalog
    from torch_xdna.runtime import Launch
    from torch_xdna.runtime.errors import BackendUnavailable, XdnaError
    from torch_xdna.runtime.sim import SimDevice
    from torch_xdna.runtime.xrt import open_xrt_device
    from torch_xdna.runtime.xrt.artifacts import ArtifactError

    from torch_xdna.kernels import numerics

    try:
        dev = open_xrt_device(True, system=system, pyxrt=pyxrt, artifacts=artifacts)
    except BackendUnavailable as e:
        return _unavailable(f"{e}", args)
    sim = SimDevice(dev.gen, dev.memory_budget)
    emulated = bool(getattr(dev.xrt, "EMULATED", False))
    receipt = {"ok": True, "hardware": not emulated, "emulated": emulated, "generation": dev.gen.name,
               "reference": f"simulator, functional level, GEMM order {REFERENCE_ORDER!r}",
               "torch_xdna": __version__, "host": platform.node(),
               "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "checks": []}
    for name, shape in CHECKS:
        ex = catalog.example(name, shape)
        key = ex.design.artifact_key()
        try:
            art = dev.artifacts.lookup(key, dev.gen.name, ex.design.name)
        except ArtifactError as e:
            return _unavailable(f"no valid artifact for {name} {shape} ({key}): {e}. {BUILD_HINT}", args)
        ins, outs = ex.tensors(seed=7)
        entry = {"design": name, "shape": shape, "key": key, "xclbin_uuid": art.xclbin_uuid,
                 "sha256": art.sha256, "toolchain": art.toolchain}
        try:
            t0 = time.perf_counter()
            with numerics.use_gemm_order(REFERENCE_ORDER):
                got = _run_on(dev, ex, ins, outs, Launch)
            entry["npu_host_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        except XdnaError as e:
            entry.update(ok=False, error=str(e))
            receipt["ok"] = False
            receipt["checks"].append(entry)
            continue
        with numerics.use_gemm_order(REFERENCE_ORDER):
            want = _run_on(sim, ex, ins, outs, Launch)
        fast = _run_on(sim, ex, ins, outs, Launch)          # the default order
        exact = all(torch.equal(g, w) for g, w in zip(got, want))
        diff = max(float((g.double() - w.double()).abs().max()) if g.numel() else 0.0
                   for g, w in zip(got, want))
        entry.update(ok=exact, bit_exact=exact, max_abs_diff=diff,
                     mismatches=sum(int((g != w).sum()) for g, w in zip(got, want)),
                     outputs=sum(g.numel() for g in got),
                     ulp_to_fast_reference=max(max_ulp(g, f) for g, f in zip(got, fast)),
                     max_abs_diff_to_fast_reference=max(
                         float((g.double() - f.double()).abs().max()) if g.numel() else 0.0
                         for g, f in zip(got, fast)))
        if not exact:
            g, w = next((g, w) for g, w in zip(got, want) if not torch.equal(g, w))
            i = int((g != w).reshape(-1).nonzero()[0])
            entry["first_mismatch"] = {"index": i, "npu": float(g.reshape(-1)[i]),
                                       "reference": float(w.reshape(-1)[i])}
        receipt["ok"] = receipt["ok"] and exact
        receipt["checks"].append(entry)
    text = json.dumps(receipt, indent=2, default=str)
    if args.receipt:
        args.receipt.write_text(text + "\n")
    if args.json:
        print(text)
    else:
        where = "the emulated NPU" if emulated else "the NPU"
        for c in receipt["checks"]:
            state = "bit-exact" if c.get("bit_exact") else ("MISMATCH" if "bit_exact" in c else "FAILED")
            if "max_abs_diff" in c:
                extra = (f"max |diff| {c['max_abs_diff']:g}; from the fast reference: "
                         f"{c['ulp_to_fast_reference']} ulp, max |diff| "
                         f"{c['max_abs_diff_to_fast_reference']:g}")
                if not c["bit_exact"]:
                    m = c["first_mismatch"]
                    extra = (f"{c['mismatches']} of {c['outputs']} outputs differ, first at {m['index']}: "
                             f"{m['npu']!r} vs {m['reference']!r}; " + extra)
            else:
                extra = c.get("error", "")
            print(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['design']:<8} {c['shape']:<10} {state} vs the "
                  f"simulator in kernel order ({extra}); artifact {c['key']} xclbin {c['xclbin_uuid']}")
        print((f"selftest passed on {where}" if receipt["ok"] else f"selftest FAILED on {where}")
              + f" ({dev.gen.name}{'; emulated, not a hardware result' if emulated else ''})")
    return 0 if receipt["ok"] else 1


def _run_on(dev, ex, ins, outs, Launch):
    """Upload, launch once, download: the outputs as host tensors."""
    in_args = [dev.upload(t) for t in ins]
    out_args = [dev.empty(tuple(t.shape), t.dtype) for t in outs]
    dev.run(Launch(ex.design, in_args, out_args, dict(ex.scalars), op="selftest"))
    return [dev.download(a) for a in out_args]


def max_ulp(a, b) -> int:
    """Largest distance between a and b in units in the last place (floats: steps between the
    two values on the ordered integer line of their bits; integers: the absolute difference)."""
    import torch
    if a.numel() == 0:
        return 0
    if not a.dtype.is_floating_point:
        return int((a.long() - b.long()).abs().max())
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[a.dtype]

    def ordered(x):
        i = x.contiguous().view(bits).long()
        return torch.where(i < 0, torch.iinfo(bits).min - i, i)
    return int((ordered(a) - ordered(b)).abs().max())
