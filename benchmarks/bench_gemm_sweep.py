"""Modeled GEMM sweep: the simulator's time for square GEMMs 64..4096 in bf16, int8 and bfp16,
next to the published calibration points, plus a roofline plot (achieved vs peak per dtype).

Every number here is MODELED by the simulator's cost model (steady state: the design already
configured, one dispatch included); nothing is measured on an NPU. Plans only: no GEMM is
executed, so the sweep is fast.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from torch_xdna.hw import NPU4, Generation
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.runtime.sim.cost import CostModel, dram_bandwidth, mixed_bandwidth

DTYPES = {"bf16": torch.bfloat16, "int8": torch.int8, "bfp16": torch.bfloat16}
SIZES_QUICK = (64, 256, 1024, 4096)
SIZES_FULL = (64, 128, 256, 512, 1024, 2048, 4096)
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def modeled_row(gen: Generation, n: int, dtype: str) -> dict:
    design = GemmDesign(n, n, n, dtype=dtype, out_dtype=DTYPES[dtype])
    plan = design.plan(gen)
    cm = CostModel(gen)
    cm.charge(design.key, plan, chained=False)            # configure once
    terms = cm.charge(design.key, plan, chained=False)    # steady state
    seconds = terms.total * 1e-6
    moved = plan.dram_read_bytes + plan.dram_write_bytes
    return {"n": n, "dtype": dtype, "modeled_us": round(terms.total, 2),
            "modeled_tops": round(2 * n ** 3 / seconds / 1e12, 3),
            "peak_tops": round(gen.peak_ops(dtype) / 1e12, 2),
            "intensity_ops_per_byte": round(2 * n ** 3 / moved, 1),
            "dram_mb": round(moved / 1e6, 2), "bound": _bound(terms),
            "tile": plan.tile, "l2_block": plan.notes.get("l2_block"),
            "cores": plan.cores}


def _bound(terms) -> str:
    stages = {"dispatch": terms.dispatch, "dram": terms.dma, "on-chip": terms.onchip,
              "compute": terms.compute}
    return max(stages, key=stages.get)


def run(quick: bool = True, gen: Generation = NPU4) -> dict:
    sizes = SIZES_QUICK if quick else SIZES_FULL
    rows = [modeled_row(gen, n, dt) for dt in DTYPES for n in sizes]
    calib = []
    for dt, target in gen.measured_gemm_ops.value.items():
        row = next((r for r in rows if r["dtype"] == dt and r["n"] == 4096), None)
        if row:
            calib.append({"dtype": dt, "n": 4096, "published_tops": round(target / 1e12, 2),
                          "modeled_tops": row["modeled_tops"],
                          "error": round(row["modeled_tops"] * 1e12 / target - 1, 4),
                          "source": gen.measured_gemm_ops.source})
    return {"benchmark": "gemm_sweep", "generation": gen.name,
            "time": "modeled (simulator), steady state incl. one dispatch",
            "dram_bandwidth_gbps": dram_bandwidth(gen, gen.columns.value) / 1e9,
            "dram_mixed_bandwidth_gbps": mixed_bandwidth(gen, gen.columns.value) / 1e9,
            "rows": rows, "calibration": calib}


def format_table(result: dict) -> str:
    lines = [f"GEMM sweep on {result['generation']} — {result['time']}",
             f"{'dtype':<6} {'n':>5} {'modeled us':>12} {'modeled TOPS':>13} {'peak':>6} "
             f"{'ops/B':>8} {'bound':>9} {'tile':>14} {'L2 block':>18}"]
    for r in result["rows"]:
        lines.append(f"{r['dtype']:<6} {r['n']:>5} {r['modeled_us']:>12.1f} {r['modeled_tops']:>13.3f} "
                     f"{r['peak_tops']:>6.1f} {r['intensity_ops_per_byte']:>8.1f} {r['bound']:>9} "
                     f"{str(r['tile']):>14} {str(r['l2_block']):>18}")
    lines += ["", "calibration points (published measurement vs modeled):"]
    for c in result["calibration"]:
        lines.append(f"  {c['dtype']:<6} 4096^3: published {c['published_tops']:.2f} TOPS, modeled "
                     f"{c['modeled_tops']:.2f} TOPS ({c['error']:+.1%})  [{c['source']}]")
    return "\n".join(lines)


def plot_roofline(result: dict, out_dir: str, gen: Generation = NPU4) -> str:
    """Achieved (modeled) ops/s vs arithmetic intensity, with each dtype's peak and the DRAM roof."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    bw = result["dram_bandwidth_gbps"] * 1e9
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = {"bf16": "tab:blue", "int8": "tab:orange", "bfp16": "tab:green"}
    xs = [r["intensity_ops_per_byte"] for r in result["rows"]]
    lo, hi = max(1.0, min(xs) / 2), max(xs) * 2
    ax.plot([lo, hi], [lo * bw / 1e12, hi * bw / 1e12], "k--", lw=1,
            label=f"DRAM read roof {bw / 1e9:.1f} GB/s")
    mixed = result["dram_mixed_bandwidth_gbps"] * 1e9
    ax.plot([lo, hi], [lo * mixed / 1e12, hi * mixed / 1e12], "k-.", lw=1,
            label=f"DRAM mixed read/write roof {mixed / 1e9:.1f} GB/s")
    peaks: dict[float, list[str]] = {}
    for dt in colors:
        peaks.setdefault(gen.peak_ops(dt) / 1e12, []).append(dt)
    for peak, names in peaks.items():
        ax.text(lo * 1.1, peak * 1.05, " / ".join(names) + f" peak {peak:.1f}", fontsize=8)
    for dt, color in colors.items():
        pts = [r for r in result["rows"] if r["dtype"] == dt]
        ax.plot([r["intensity_ops_per_byte"] for r in pts], [r["modeled_tops"] for r in pts],
                "o-", color=color, label=f"{dt} modeled")
        ax.axhline(gen.peak_ops(dt) / 1e12, color=color, ls=":", lw=1)
        meas = gen.measured_gemm_ops.value.get(dt)
        if meas:
            ax.plot([pts[-1]["intensity_ops_per_byte"]], [meas / 1e12], "*", color=color,
                    markersize=12, label=f"{dt} published (4096^3)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (ops per DRAM byte, modeled plan)")
    ax.set_ylabel("TOPS")
    ax.set_title(f"XDNA2 {gen.name} GEMM roofline — MODELED by the simulator (not measured)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    path = os.path.join(out_dir, "roofline.png")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--full", action="store_true", help="all sizes 64..4096")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument("--out", default=OUT_DIR, help="directory for roofline.png")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    result = run(quick=not args.full)
    if not args.no_plot:
        result["roofline_png"] = plot_roofline(result, args.out)
    if args.json:
        print(json.dumps(result, indent=2, default=list))
    else:
        print(format_table(result))
        if "roofline_png" in result:
            print(f"\nroofline plot (modeled): {result['roofline_png']}")


if __name__ == "__main__":
    main()
