"""OpInfo conformance of the supported models' op list (torch_xdna/testing/conformance.py).

Pass rates of PyTorch's own OpInfo samples on xdna against the CPU reference under the
documented numerics, with fallbacks allowed (default) and on NPU kernels only (strict). Results
are from the simulator's functional level; wall time is measured on this host. quick: 6 samples
per op and dtype (float32, bfloat16, int64 where listed); full: every sample.
"""
from __future__ import annotations

import json


def run(quick: bool = True) -> dict:
    from torch_xdna.testing import conformance as conf
    result = conf.run(max_samples=conf.DEFAULT_MAX_SAMPLES if quick else 10 ** 6)
    t = result["totals"]
    not_clean = {o["op"]: {"samples": o["samples"], "default_pass": o["default_pass"],
                           "strict_pass": o["strict_pass"], "fallbacks": o["fallbacks"],
                           "reasons": o["reasons"]}
                 for o in result["ops"] if o["strict_pass"] < o["samples"]}
    return {"ops": t["ops"], "samples": t["samples"], "skipped_random": t["skipped_random"],
            "default_pass_rate": round(t["default_rate"], 4),
            "strict_pass_rate": round(t["strict_rate"], 4),
            "worst_error_bf16_roundings": max(o["worst_units"] for o in result["ops"]),
            "not_strict_clean": not_clean, "host_wall_s": t["wall_s"],
            "note": "simulator functional level (NPU numerics on the host); wall time measured"}


def main() -> None:
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--full", action="store_true", help="every OpInfo sample (minutes)")
    print(json.dumps(run(quick=not p.parse_args().full), indent=2))


if __name__ == "__main__":
    main()
