"""Shared by the end-to-end tests on the emulated NPU (tests/test_emulated_*.py): build a model's
artifacts with the fake toolchain, and run a CLI job either on the simulator or through the xrt
backend on the emulated NPU (emulated results only)."""
from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import fake_toolchain
from torch_xdna.cli.main import main
from torch_xdna.runtime.backends import set_device_for_testing
from torch_xdna.runtime.xrt.session import release_devices


def build_artifacts(root: Path, model: Path, *args: str) -> tuple[Path, dict]:
    """(artifact store, `xdna kernels build --json` summary) of `model`, built with the fake
    toolchain (tests/fake_toolchain.py) into root/store."""
    store = root / "store"
    mp = pytest.MonkeyPatch()
    fake_toolchain.install(root / "tc", mp)
    try:
        out = io.StringIO()
        with redirect_stdout(out):
            rc = main(["kernels", "build", "--model", str(model), "--artifact-dir", str(store),
                       "--json", *args])
        assert rc == 0, out.getvalue()
        return store, json.loads(out.getvalue())
    finally:
        mp.undo()


def select_backend(monkeypatch, store: Path | None = None, kernel_order: bool = True):
    """Select the simulator (store None) or the emulated NPU with `store`'s artifacts, the
    functional level's order (see run_job), and a process device opened anew from that
    environment; returns the previous device (give it back to set_device_for_testing)."""
    if kernel_order:
        monkeypatch.setenv("TORCH_XDNA_LAYER_ORDER", "plan")
        monkeypatch.setenv("TORCH_XDNA_GEMM_ORDER", "kernel")
    else:
        monkeypatch.delenv("TORCH_XDNA_LAYER_ORDER", raising=False)
        monkeypatch.delenv("TORCH_XDNA_GEMM_ORDER", raising=False)
    if store is not None:
        monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
        monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
        monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(store))
    release_devices()
    return set_device_for_testing(None)


def run_job(argv: list[str], capsys, monkeypatch, store: Path | None = None,
            kernel_order: bool = True) -> dict:
    """The JSON output of `xdna ARGV`: on the simulator, or (store given) through the xrt
    backend on the emulated NPU with that artifact store. kernel_order: the functional level in
    the stages' order with the core kernels' GEMM order (TORCH_XDNA_LAYER_ORDER=plan,
    TORCH_XDNA_GEMM_ORDER=kernel), else the defaults."""
    prev = select_backend(monkeypatch, store, kernel_order)
    try:
        capsys.readouterr()
        rc = main(argv)
        assert rc == 0
        return json.loads(capsys.readouterr().out)
    finally:
        set_device_for_testing(prev)
        release_devices()
