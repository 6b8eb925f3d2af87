"""Do no harm: with the backend autoloaded, CPU-only programs behave as without the package.

The probe runs in fresh interpreters (autoload on, and TORCH_DEVICE_BACKEND_AUTOLOAD=0) and
prints what a CPU program sees: DataLoader(pin_memory=True) batches, tensor.pin_memory(),
non-blocking copies. Without an accelerator PyTorch cannot pin (pin_memory() raises, the
DataLoader warns and skips pinning); with torch-xdna registered as the accelerator, pinning works as
it does with CUDA: same values, same sizes/strides, is_pinned() True.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import torch
    import torch.utils.data as D
    out = {"accelerator": str(torch.accelerator.current_accelerator())}
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g)
    ds = D.TensorDataset(torch.arange(40.).view(10, 4), torch.arange(10))
    for workers in (0, 2):
        dl = D.DataLoader(ds, batch_size=3, shuffle=True, pin_memory=True, num_workers=workers,
                          generator=torch.Generator().manual_seed(1))
        batches = [(a.tolist(), b.tolist(), a.is_pinned()) for a, b in dl]
        out[f"loader{workers}"] = [bt[:2] for bt in batches]
        out[f"loader{workers}_pinned"] = all(bt[2] for bt in batches)
    out["x_is_pinned"] = x.is_pinned()
    try:
        p = x.t().pin_memory()
        out["pin"] = [p.tolist(), list(p.stride()), p.is_pinned(), p[1:].is_pinned(),
                      p.pin_memory() is p]
    except RuntimeError as e:
        out["pin"] = "raises"
    y = x.to("cpu", non_blocking=True)
    out["cpu_nb"] = [y.tolist(), y is x]
    out["grad"] = None
    w = torch.randn(5, 3, generator=g, requires_grad=True)
    (x @ w).sum().backward()
    out["grad"] = w.grad.tolist()
    if "xdna" in out["accelerator"]:
        d = x.to("xdna", non_blocking=True)
        back = d.to("cpu", non_blocking=True)
        out["xdna_roundtrip"] = [back.tolist(), back.is_pinned(), back.device.type]
        pd = x.pin_memory().to("xdna", non_blocking=True)
        out["pinned_to_xdna"] = pd.cpu().tolist()
        out["to_dtype_nb"] = d.to("cpu", torch.float64, non_blocking=True).dtype == torch.float64
        out["fallbacks"] = torch.xdna.fallback_report()
    print(json.dumps(out))
""")


def _run(autoload: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1" if autoload else "0"
    env.pop("TORCH_XDNA_FALLBACK", None)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env,
                       timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> tuple[dict, dict]:
    return _run(True), _run(False)


def test_autoload_registers_the_accelerator(runs):
    on, off = runs
    assert on["accelerator"] == "xdna" and off["accelerator"] == "None"


def test_dataloader_pin_memory_same_batches(runs):
    on, off = runs
    for w in (0, 2):
        assert on[f"loader{w}"] == off[f"loader{w}"]
        assert on[f"loader{w}_pinned"] is True        # pinned through torch-xdna's hook
        assert off[f"loader{w}_pinned"] is False      # no accelerator: PyTorch skips pinning


def test_pin_memory_and_non_blocking_copies(runs):
    on, off = runs
    assert on["x_is_pinned"] is False and off["x_is_pinned"] is False
    assert off["pin"] == "raises"                     # CPU-only PyTorch: no accelerator to pin for
    values, stride, pinned, view_pinned, idempotent = on["pin"]
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    assert values == x.t().tolist() and stride == [1, 5]   # sizes/strides kept, as PyTorch's kernel
    assert pinned and view_pinned and idempotent
    assert on["cpu_nb"] == off["cpu_nb"] and on["cpu_nb"][1] is True
    assert on["grad"] == off["grad"]


def test_xdna_non_blocking_copies(runs):
    on, _ = runs
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    back, pinned, dev = on["xdna_roundtrip"]
    assert back == x.tolist() and pinned is True and dev == "cpu"
    assert on["pinned_to_xdna"] == x.tolist()
    assert on["to_dtype_nb"] is True
    assert on["fallbacks"] == {}


def test_pinned_tracking_follows_storage_lifetime():
    import gc

    from torch_xdna.device import pinned
    p = torch.ones(1000).pin_memory()
    ptr = p.untyped_storage().data_ptr()
    assert p.is_pinned() and ptr in pinned._pinned
    del p
    gc.collect()
    assert ptr not in pinned._pinned
    assert not torch.ones(1000).is_pinned()


def test_has_primary_context_hook_does_not_open_the_device():
    from torch_xdna.device import pinned
    assert pinned.HOOKS.is_available() and pinned.HOOKS.is_built()
    torch.ones(2, device="xdna")
    assert pinned.HOOKS.has_primary_context(0) is True
