"""Back-test report: per published figure, modeled vs published, ratio and dominant terms.

`python -m benchmarks.backtest.report [--json]` (or `xdna bench backtest`). Fitted figures and
held-out figures (not used to choose any constant) are listed separately; each row also shows
the previous model version's ratio (previous.py), i.e. before / after.
"""
from __future__ import annotations

import json
import sys

from torch_xdna.hw import Generation, get_generation
from torch_xdna.runtime.sim.cost import MODEL_VERSION

try:
    from .figures import FIGURES, Figure
    from .layouts import LAYOUTS
    from .previous import PREVIOUS, PREVIOUS_VERSION
except ImportError:                 # loaded as a file by `xdna bench`
    from benchmarks.backtest.figures import FIGURES, Figure
    from benchmarks.backtest.layouts import LAYOUTS
    from benchmarks.backtest.previous import PREVIOUS, PREVIOUS_VERSION


def evaluate(fig: Figure, gen: Generation) -> dict:
    modeled, terms, meta = LAYOUTS[fig.layout](gen)
    ratio = modeled / fig.value
    if fig.unit in ("tok/s", "ops/s", "B/s"):    # rates: a larger modeled rate is "faster"
        time_ratio = 1 / ratio
    else:
        time_ratio = ratio
    pos = {k: v for k, v in terms.items() if v > 0}
    tot = sum(pos.values()) or 1.0
    dominant = sorted(pos.items(), key=lambda kv: -kv[1])[:3]
    lo, hi = fig.tolerance
    before = PREVIOUS.get(fig.key)
    return {"before_version": PREVIOUS_VERSION,
            "before_ratio": before[1] if before else None, "key": fig.key, "what": fig.what, "who": fig.who, "unit": fig.unit,
            "published": fig.value, "modeled": modeled, "ratio": ratio,
            "time_ratio": time_ratio, "held_out": fig.held_out, "in_band": lo <= ratio <= hi,
            "band": fig.tolerance, "fits": fig.fits,
            "dominant": [f"{k} {100 * v / tot:.0f}%" for k, v in dominant], **meta}


def run_all(gen: Generation | None = None) -> list[dict]:
    gen = gen or get_generation("npu4")
    return [evaluate(f, gen) for f in FIGURES]


def _fmt(v: float, unit: str) -> str:
    if unit == "ops/s":
        return f"{v / 1e12:.2f} T"
    if unit == "B/s":
        return f"{v / 1e9:.1f} GB/s"
    return f"{v:.4g} {unit}"


def _before(r: dict) -> str:
    """The previous model version's ratio (before / after), '-' for a figure new since then."""
    return "-" if r.get("before_ratio") is None else f"{r['before_ratio']:.2f}x"


def table(rows: list[dict]) -> str:
    out = [f"cost model {MODEL_VERSION} (all modeled figures from the simulator)"]
    for title, held in (("fitted / asserted (band 0.75-1.33x; GEMM 0.85-1.15x)", False),
                        ("held out (reported, not asserted)", True)):
        out += ["", title, f"{'figure':<52} {'published':>14} {'modeled':>14} {'ratio':>6} "
                f"{PREVIOUS_VERSION:>8}  dominant"]
        for r in rows:
            if r["held_out"] != held:
                continue
            flag = "" if r["in_band"] else " !"
            out.append(f"{r['who'] + ': ' + r['what']:<52.52} {_fmt(r['published'], r['unit']):>14} "
                       f"{_fmt(r['modeled'], r['unit']):>14} {r['ratio']:>5.2f}x{flag:<2}"
                       f"{_before(r):>7}  {', '.join(r['dominant'])}"
                       + (f" [fits {r['fits']}]" if r["fits"] else "")
                       + (f" [NPU part alone: {_fmt(r['npu_only_tok_s'], r['unit'])}]"
                          if "npu_only_tok_s" in r else ""))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    rows = run_all()
    print(json.dumps(rows, indent=2) if "--json" in argv else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
