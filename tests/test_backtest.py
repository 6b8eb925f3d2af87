"""The cost model against published end-to-end XDNA2 figures (benchmarks/backtest).

Fitted figures must land within their band (0.75x-1.33x of published; the whole-array GEMM
calibration points within +-15%); held-out figures (not used to choose any constant) are
computed and printed, never asserted. All modeled figures are the simulator's.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.backtest.figures import FIGURES  # noqa: E402
from benchmarks.backtest.report import evaluate  # noqa: E402
from torch_xdna.hw import NPU4  # noqa: E402
from torch_xdna.kernels.vector import VectorDesign  # noqa: E402
from torch_xdna.runtime.sim.cost import MODEL_VERSION, CostModel  # noqa: E402

FITTED = [f for f in FIGURES if not f.held_out]
HELD_OUT = [f for f in FIGURES if f.held_out]


def test_figures_carry_their_provenance():
    keys = [f.key for f in FIGURES]
    assert len(keys) == len(set(keys))
    for f in FIGURES:
        for field in ("who", "hardware", "software", "source", "unit", "layout"):
            assert getattr(f, field), f"{f.key}: {field} missing"
        assert f.value > 0
    assert HELD_OUT and FITTED
    assert {"xe_qwen3_170", "xe_qwen3_366", "flm_qwen3_decode", "flm_qwen3_prefill",
            "gemm_bf16", "gemm_int8", "gemm_bfp16"} <= set(keys)


@pytest.mark.parametrize("fig", FITTED, ids=lambda f: f.key)
def test_fitted_figure_within_band(fig):
    r = evaluate(fig, NPU4)
    lo, hi = fig.tolerance
    assert lo <= r["ratio"] <= hi, (f"{MODEL_VERSION}: {fig.what}: modeled {r['modeled']:.4g} "
                                    f"vs published {fig.value:.4g} {fig.unit} ({r['ratio']:.2f}x)")


def test_gemm_calibration_points_within_15_percent():
    for f in FITTED:
        if f.key.startswith("gemm_"):
            assert f.tolerance == (0.85, 1.15)


def test_xdna_engine_layout_matches_published_dispatch_counts():
    for key, dispatches, designs in (("xe_qwen3_170", 170, 8), ("xe_qwen3_366", 366, 14)):
        fig = next(f for f in FIGURES if f.key == key)
        r = evaluate(fig, NPU4)
        assert (r["dispatches"], r["designs"]) == (dispatches, designs)


def test_held_out_figures_are_reported(capsys):
    rows = [evaluate(f, NPU4) for f in HELD_OUT]
    for r in rows:
        assert math.isfinite(r["ratio"]) and r["ratio"] > 0
        print(f"held out: {r['what']}: {r['ratio']:.2f}x")


def test_design_change_within_a_context_costs_a_configure_point():
    a = VectorDesign("relu", ((64,),), (torch.float32,), (64,), torch.float32)
    b = VectorDesign("relu", ((1, 128),), a.in_dtypes, (1, 128), a.out_dtype)
    cm, ctx = CostModel(NPU4), ("one ELF",)
    first = cm.charge(a.key, a.plan(NPU4), chained=False, context=ctx)
    assert first.reconfig == pytest.approx(NPU4.reconfig_us.value)
    t = cm.charge(b.key, b.plan(NPU4), chained=False, context=ctx)
    assert t.reconfig == pytest.approx(NPU4.design_change_us.value) and t.context_switch == 0
    same = cm.charge(b.key, b.plan(NPU4), chained=False, context=ctx)
    assert same.reconfig == 0
