"""The `xdna` command: help teaches, info/demo work on the simulator, JSON for scripts."""
from __future__ import annotations

import json

from torch_xdna.cli.main import main


def test_help_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    for cmd in ("info", "demo", "bench"):
        assert cmd in out
    assert "TORCH_XDNA_BACKEND" in out


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backend"] == "sim" and info["simulated"] is True
    assert info["generation"] == "npu4" and info["l1_bytes_per_core"] == 65536


def test_demo_json(capsys):
    assert main(["demo", "--json", "--layers", "1", "--hidden", "64"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["launches"] == 4 and r["host_fallbacks"] == 0
    assert r["max_abs_diff_vs_cpu"] < 5e-2
    assert r["modeled_npu_us"] > 4 * 61.0


def test_bench_unknown_name_is_clear(capsys):
    assert main(["bench", "nope"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
