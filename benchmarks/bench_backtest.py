"""`xdna bench backtest`: the cost model against published end-to-end XDNA2 figures (modeled).

`run()` returns the rows and the table as data (so `xdna bench --json` stays valid JSON);
`python benchmarks/bench_backtest.py` prints the table.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.backtest.report import run_all, table  # noqa: E402
from torch_xdna.runtime.sim.cost import MODEL_VERSION  # noqa: E402


def run(quick: bool = True) -> dict:
    rows = run_all()
    return {"model_version": MODEL_VERSION, "table": table(rows).splitlines(), "figures": rows,
            "all_fitted_in_band": all(r["in_band"] for r in rows if not r["held_out"])}


if __name__ == "__main__":
    print(table(run_all()))
