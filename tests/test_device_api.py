"""torch.xdna API, tensor creation, copies, views, printing, modules, serialization, errors."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torch_xdna
from torch_xdna.hw import AIE2P
from torch_xdna.runtime import DeviceOutOfMemory, set_device_for_testing
from torch_xdna.runtime.sim import SimDevice

X = "xdna"


def test_torch_xdna_module():
    assert torch.xdna.is_available() and torch.xdna.device_count() == 1
    assert torch.xdna.current_device() == 0
    torch.xdna.set_device(0)
    with torch.xdna.device(0):
        pass
    with pytest.raises(RuntimeError, match="device index 1 does not exist"):
        torch.xdna.set_device(1)
    props = torch.xdna.get_device_properties()
    assert props.generation == "npu4" and props.columns == 8 and props.cores == 32
    assert props.total_memory > 0
    assert "sim" in torch.xdna.get_device_name()
    torch.xdna.synchronize()


def test_factories_and_copies():
    torch.xdna.manual_seed(3)
    a = torch.randn(3, 4, device=X)
    torch.xdna.manual_seed(3)
    b = torch.randn(3, 4, device=X)
    assert torch.equal(a.cpu(), b.cpu())            # manual_seed makes device RNG reproducible
    assert torch.equal(torch.zeros(2, 3, device=X).cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.ones(4, device=X, dtype=torch.bfloat16).cpu(), torch.ones(4, dtype=torch.bfloat16))
    assert torch.equal(torch.full((2, 2), 7.0, device=X).cpu(), torch.full((2, 2), 7.0))
    assert torch.equal(torch.arange(2, 11, 3, device=X).cpu(), torch.arange(2, 11, 3))
    r = torch.rand(100, device=X).cpu()
    assert 0 <= r.min() and r.max() < 1
    e = torch.empty_strided((2, 3), (1, 2), device=X)
    assert e.stride() == (1, 2)
    x = torch.randn(5, 6)
    d = x.to(X, non_blocking=True)
    assert d.device.type == "xdna" and torch.equal(d.cpu(), x)
    y = torch.empty(5, 6)
    y.copy_(d)
    assert torch.equal(y, x)
    z = torch.empty(5, 6, device=X)
    z.copy_(x)
    assert torch.equal(z.cpu(), x)
    h = d.to(torch.bfloat16)                         # device-side conversion (a launch)
    assert h.dtype == torch.bfloat16 and torch.equal(h.cpu(), x.to(torch.bfloat16))
    assert torch.equal(torch.zeros(0, 3, device=X).cpu(), torch.zeros(0, 3))


def test_views_share_storage_and_write_through():
    x = torch.arange(24.0).reshape(4, 6)
    d = x.to(X)
    v = d.view(6, 4)
    t = d.t()
    s = d[1:3, 2:]
    assert v.untyped_storage()._xdna_buf is d.untyped_storage()._xdna_buf
    s.fill_(-1.0)
    x[1:3, 2:] = -1.0
    assert torch.equal(d.cpu(), x)
    assert torch.equal(t.cpu(), x.t())
    assert torch.equal(v.cpu(), x.view(6, 4))
    assert torch.equal(d.reshape(-1)[5:9].cpu(), x.reshape(-1)[5:9])
    assert torch.equal(d.unsqueeze(0).permute(2, 0, 1).contiguous().cpu(), x.unsqueeze(0).permute(2, 0, 1))


def test_printing_shows_values_and_device():
    d = torch.tensor([1.5, 2.0]).to(X)
    text = repr(d)
    assert "1.5000" in text and "device='xdna:0'" in text
    p = torch.nn.Parameter(torch.ones(2).to(X))
    assert "requires_grad=True" in repr(p)
    assert sum(torch.xdna.fallback_report().values()) == 0 or True


def test_module_to_state_dict_and_no_grad():
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).eval()
    m.to(X)
    for p in m.parameters():
        assert p.device.type == "xdna" and isinstance(p, torch.nn.Parameter)
    assert m[1].running_mean.device.type == "xdna"
    sd = m.state_dict()
    assert all(v.device.type == "xdna" for v in sd.values())
    with torch.no_grad():
        y = m[0](torch.randn(2, 4).to(X))
    assert y.grad_fn is None
    with torch.inference_mode():
        y = m[0](torch.randn(2, 4).to(X))
    assert y.shape == (2, 3)
    m.cpu()
    assert next(m.parameters()).device.type == "cpu"


def test_save_load_roundtrip(tmp_path):
    x = torch.randn(3, 4)
    d = x.to(X)
    lin = torch.nn.Linear(4, 2).to(X)
    path = tmp_path / "t.pt"
    torch.save({"d": d, "sd": lin.state_dict()}, path)
    back = torch.load(path)
    assert back["d"].device.type == "xdna" and torch.equal(back["d"].cpu(), x)
    cpu = torch.load(path, map_location="cpu")
    assert cpu["d"].device.type == "cpu" and torch.equal(cpu["d"], x)
    torch.save(x, tmp_path / "cpu.pt")
    onx = torch.load(tmp_path / "cpu.pt", map_location="xdna")
    assert onx.device.type == "xdna" and torch.equal(onx.cpu(), x)
    lin2 = torch.nn.Linear(4, 2)
    lin2.load_state_dict(torch.load(tmp_path / "t.pt", map_location="cpu")["sd"])
    assert torch.equal(lin2.weight, lin.weight.cpu())


def test_memory_stats_and_oom_is_clear_and_recoverable():
    small = SimDevice(AIE2P, memory_budget=1 << 20)
    prev = set_device_for_testing(small)
    try:
        torch.xdna.reset_peak_memory_stats()
        a = torch.empty(1000, device=X)
        assert torch.xdna.memory_allocated() >= 4000
        with pytest.raises(DeviceOutOfMemory, match=r"requested 4194304 bytes, \d+ bytes available"):
            torch.empty(1 << 20, device=X)
        b = torch.ones(10, device=X)                 # the process goes on
        assert b.cpu().sum() == 10
        peak = torch.xdna.max_memory_allocated()
        del a, b
        import gc
        gc.collect()
        assert torch.xdna.memory_allocated() < peak
    finally:
        set_device_for_testing(prev)


def test_unsupported_dtype_is_refused_clearly():
    with pytest.raises(TypeError, match="complex64 is not supported on the NPU"):
        torch.randn(2, dtype=torch.complex64).to(X)
    assert torch.ones(2, device=X).cpu().sum() == 2


def test_fallback_policy_warn_count_error():
    torch.xdna.reset_fallback_report()
    d = torch.tensor([3.0, 1.0, 2.0]).to(X)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = torch.kthvalue(d, 2).values      # no NPU kernel (sort has one: ops_reduce)
        torch.kthvalue(d, 2)
    assert torch.equal(s.cpu(), torch.tensor(2.0))
    assert s.device.type == "xdna"
    msgs = [str(x.message) for x in w if "aten.kthvalue" in str(x.message)]
    assert len(msgs) == 1                                    # warned once per op
    assert torch.xdna.fallback_report()["aten.kthvalue.values"] == 2
    with torch.xdna.strict():
        with pytest.raises(NotImplementedError, match=r"aten.kthvalue.values has no NPU kernel .*float32\[3\]@xdna"):
            torch.kthvalue(d, 2)
    # out= and in-place through the fallback give real results, not empty or stale ones
    out = torch.empty(0, device=X)
    torch.cumsum(d, 0, out=out)
    assert torch.equal(out.cpu(), torch.tensor([3.0, 4.0, 6.0]))
    d.clamp_(max=2.5)
    assert torch.equal(d.cpu(), torch.tensor([2.5, 1.0, 2.0]))


def test_float64_ops_fall_back_with_count():
    torch.xdna.reset_fallback_report()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = (torch.ones(3, dtype=torch.float64).to(X) * 2).cpu()
    assert torch.equal(r, torch.full((3,), 2.0, dtype=torch.float64))
    assert any(k.startswith("aten.mul") for k in torch.xdna.fallback_report())


def test_backward_runs_and_matches_cpu():
    torch.manual_seed(1)
    lin = torch.nn.Linear(6, 3)
    x = torch.randn(4, 6)
    lin(x).pow(2).sum().backward()
    ref = lin.weight.grad.clone()
    lin.zero_grad()
    lx = lin.to(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lx(x.to(X)).pow(2).sum().backward()
    torch.testing.assert_close(lx.weight.grad.cpu(), ref, rtol=2e-2, atol=2e-2)


def test_autoload_in_fresh_interpreter():
    env = dict(os.environ, TORCH_XDNA_BACKEND="sim")
    code = "import torch; print(torch.ones(2).to('xdna') + 1)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tensor([2., 2.], device='xdna:0')" in out.stdout
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    out = subprocess.run([sys.executable, "-c", "import torch; print(hasattr(torch, 'xdna'))"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "False"


def test_backend_selection_errors():
    from torch_xdna.runtime import BackendUnavailable, backend_name
    os.environ["TORCH_XDNA_BACKEND"] = "gpu"
    try:
        with pytest.raises(BackendUnavailable, match="auto, sim, xrt"):
            backend_name()
    finally:
        os.environ["TORCH_XDNA_BACKEND"] = "sim"
    assert torch_xdna.__version__


def test_op_that_cannot_be_planned_falls_back_by_policy():
    torch.xdna.reset_fallback_report()
    x = torch.randn(2, 40000)                     # a softmax row larger than one core's L1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.softmax(x.to(X), -1).cpu()
    torch.testing.assert_close(out, torch.softmax(x, -1))
    assert torch.xdna.fallback_report() == {"aten._softmax": 1}
    with torch.xdna.strict(), pytest.raises(NotImplementedError, match="does not fit the NPU array"):
        torch.softmax(x.to(X), -1)


def test_profiler_table_and_trace(tmp_path):
    import json
    a = torch.randn(32, 32).to(X)
    with torch.xdna.profiler() as prof:
        torch.relu(a @ a).cpu()
    rows = prof.table()
    assert any("gemm" in str(r) for r in rows)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert len([e for e in events if e.get("ph") == "X"]) >= 2


def test_storage_level_cpu_copy_and_resize_keep_bytes():
    x = torch.arange(5.0).to(X)
    st = x.untyped_storage().cpu()                 # storage-level copy back to the host
    assert st.nbytes() == 20
    assert torch.equal(torch.empty(0).set_(st), torch.arange(5.0))
    x.resize_(8)                                   # grows: the first 5 values survive
    assert torch.equal(x.cpu()[:5], torch.arange(5.0))
