"""The `xdna` command: help teaches, info/demo work on the simulator, JSON for scripts."""
from __future__ import annotations

import json

import pytest

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


def test_bench_runs_quick_or_names_the_script(tmp_path):
    """`xdna bench NAME` calls run(quick=...) or an argument-free run(); a benchmark with its own
    options (no such run) is refused with the command that runs it."""
    from torch_xdna.cli.tools.bench import _run_one
    from torch_xdna.cli.args import CliError
    (tmp_path / "bench_a.py").write_text("def run(quick=True):\n    return {'quick': quick}\n")
    (tmp_path / "bench_b.py").write_text("def run(only=None):\n    return {'only': only}\n")
    (tmp_path / "bench_c.py").write_text("def main(argv=None):\n    return 0\n")
    assert _run_one("a", tmp_path / "bench_a.py", quick=False) == {"quick": False}
    assert _run_one("b", tmp_path / "bench_b.py", quick=True) == {"only": None}
    with pytest.raises(CliError, match=r"bench_c.py --help"):
        _run_one("c", tmp_path / "bench_c.py", quick=True)
