"""The settings table (torch_xdna/runtime/settings.py) is the one list of environment variables:
the README's table and `xdna info --env` show the same names, and a bad value is refused with a
message naming the variable, the value and what to set."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from torch_xdna.cli.main import main
from torch_xdna.runtime import settings
from torch_xdna.runtime.settings import EnvError

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_env_names() -> set[str]:
    """The backticked names in the first column of the README's "Environment variables" table."""
    text = README.read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]*)`", line.split("|")[1]))
    return names


def test_readme_table_lists_the_settings_table():
    public = {s.name for s in settings.SETTINGS.values() if not s.internal}
    assert readme_env_names() == public


def test_info_env_lists_every_setting(capsys, monkeypatch):
    monkeypatch.setenv("XDNA_API_KEY", "sekrit")
    assert main(["info", "--env", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == list(settings.SETTINGS)
    key = next(r for r in rows if r["name"] == "XDNA_API_KEY")
    assert key["value"] == "<hidden>"                       # a secret is never printed
    backend = next(r for r in rows if r["name"] == "TORCH_XDNA_BACKEND")
    assert backend["allowed"] == ["auto", "sim", "xrt"] and backend["default"] == "auto"


def test_info_env_flags_a_bad_value(capsys, monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_GEMM_ORDER", "fastest")
    assert main(["info", "--env"]) == 2
    out = capsys.readouterr().out
    assert "INVALID: TORCH_XDNA_GEMM_ORDER='fastest' is not a GEMM order; use one of plan, blas" in out


def test_choice_flag_and_default(monkeypatch):
    monkeypatch.delenv("TORCH_XDNA_FALLBACK", raising=False)
    assert settings.get("TORCH_XDNA_FALLBACK") == "warn"
    monkeypatch.setenv("TORCH_XDNA_FALLBACK", " Error ")
    assert settings.get("TORCH_XDNA_FALLBACK") == "error"
    monkeypatch.setenv("TORCH_XDNA_FALLBACK", "loud")
    with pytest.raises(EnvError, match=r"TORCH_XDNA_FALLBACK='loud' is not a fallback mode; "
                                       r"use one of warn, error, silent"):
        settings.get("TORCH_XDNA_FALLBACK")
    monkeypatch.setenv("TORCH_XDNA_HOST_KERNELS", "off")
    assert settings.get("TORCH_XDNA_HOST_KERNELS") is False
    monkeypatch.setenv("TORCH_XDNA_HOST_KERNELS", "maybe")
    with pytest.raises(EnvError, match="TORCH_XDNA_HOST_KERNELS='maybe' is not a switch"):
        settings.get("TORCH_XDNA_HOST_KERNELS")
    monkeypatch.setenv("TORCH_XDNA_GENERATION", "npu9")
    with pytest.raises(EnvError, match="npu1, npu4, npu5, npu6"):
        settings.get("TORCH_XDNA_GENERATION")


def test_undeclared_variable_is_a_key_error():
    with pytest.raises(KeyError):
        settings.get("TORCH_XDNA_NOT_DECLARED")


def test_native_cache_bounds_are_set_when_unset_and_kept_when_set(monkeypatch):
    # torch's and oneDNN's shape-keyed primitive caches: unbounded in practice at their defaults
    # (the soak's RSS growth at --max-batch 1, docs/serving.md); ours when the user set none
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    settings.bound_native_caches()
    import os
    assert os.environ["LRU_CACHE_CAPACITY"] == "16"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "512"
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "0")          # crashes this torch: refused
    with pytest.raises(EnvError, match="LRU_CACHE_CAPACITY='0'"):
        settings.bound_native_caches()


def test_importing_torch_xdna_leaves_the_native_caches_alone():
    """Installing the package changes nothing for a CPU-only program: only `xdna serve` (and the
    soak benchmark) bound torch's and oneDNN's primitive caches."""
    import subprocess
    import sys
    code = ("import os; os.environ.pop('LRU_CACHE_CAPACITY', None); "
            "os.environ.pop('ONEDNN_PRIMITIVE_CACHE_CAPACITY', None); import torch, torch_xdna; "
            "print(os.environ.get('LRU_CACHE_CAPACITY'), os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["None", "None"], out.stderr
