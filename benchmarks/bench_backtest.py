"""`xdna bench backtest`: the cost model against published end-to-end XDNA2 figures (modeled)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.backtest.report import run_all, table  # noqa: E402


def run(quick: bool = True) -> dict:
    rows = run_all()
    print(table(rows))
    return {"figures": rows, "all_fitted_in_band": all(r["in_band"] for r in rows if not r["held_out"])}


if __name__ == "__main__":
    run()
