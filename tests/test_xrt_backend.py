"""The xrt backend through a fake pyxrt: protocol (order, flags, group ids, sync directions), run-state
errors, context LRU, device opened once, and end-to-end results equal to the simulator's."""
from __future__ import annotations

import pytest
import torch

from fake_host import healthy_strix
from fake_pyxrt import FakeXrt, ProtocolError, ert_cmd_state, make_artifact
from torch_xdna.hw import NPU4
from torch_xdna.kernels import GemmDesign, VectorDesign
from torch_xdna.runtime import BackendUnavailable, Launch, LaunchError, Program
from torch_xdna.runtime.sim import SimDevice
from torch_xdna.runtime.xrt import open_xrt_device
from torch_xdna.runtime.xrt.artifacts import ArtifactError, ArtifactStore
from torch_xdna.runtime.xrt.device import XrtDevice
from torch_xdna.runtime.xrt.session import release_devices

BUDGET = 64 << 20


@pytest.fixture(autouse=True)
def _fresh_devices():
    release_devices()
    yield
    release_devices()


def xrt_device(tmp_path, fx=None) -> tuple[XrtDevice, FakeXrt]:
    fx = fx or FakeXrt()
    return XrtDevice(NPU4, BUDGET, fx, ArtifactStore(tmp_path / "art")), fx


def gemm_case(dev, m=8, k=32, n=16, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g)
    b = torch.randn(k, n, generator=g)
    bias = torch.randn(n, generator=g)
    design = GemmDesign(m, k, n, bias=True, **kw)
    ins = [dev.upload(a), dev.upload(b), dev.upload(bias)]
    out = dev.empty((m, n), torch.float32)
    return design, (a, b, bias), ins, out


def install(tmp_path, fx, design, ins, outs, **kw):
    return make_artifact(tmp_path / "art", fx, design, NPU4, ins, outs, **kw)


def bf16(x):
    return x.to(torch.bfloat16).float()


def test_gemm_end_to_end_matches_simulator(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, (a, b, bias), ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    dev.run(Launch(design, ins, [out], op="mlp.up"))
    got = dev.download(out)

    sim = SimDevice(NPU4, BUDGET)
    s_ins = [sim.upload(t) for t in (a, b, bias)]
    s_out = sim.empty((8, 16), torch.float32)
    sim.run(Launch(design, s_ins, [s_out]))
    assert torch.equal(got, sim.download(s_out))                       # same numerics, bit for bit
    ref = bf16(a) @ bf16(b) + bf16(bias)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)          # bf16 operands, fp32 accumulate
    assert dev.counters.launches == 1 and dev.counters.dispatches == 1


def test_protocol_order_flags_groups(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    fx.calls.clear()
    dev.run(Launch(design, ins, [out]))
    names = fx.names()
    # device opened at construction; then xclbin -> register -> context -> kernel -> instr BO -> launch
    order = ["xclbin", "register_xclbin", "hw_context", "kernel", "bo", "launch", "wait"]
    idx = [names.index(n) for n in order]
    assert idx == sorted(idx), names
    # data buffers synced by the runtime before the kernel loads; the instruction BO right after creation
    assert names[:3] == ["sync"] * 3          # the three uploaded inputs (the output was never written)
    assert "sync" in names[names.index("bo"):names.index("launch")]
    instr = next(c for c in fx.calls if c[0] == "bo")
    assert instr[2] == fx.bo.cacheable and instr[3] == FakeXrt.INSTR_GROUP     # group_id(1)
    assert ("group_id", 1) in fx.calls and ("group_id", 3) in fx.calls and ("group_id", 6) in fx.calls
    launch = next(c for c in fx.calls if c[0] == "launch")
    assert launch[1] == 3 and launch[2] == 16 and launch[3] == 4             # opcode 3, 64 B = 16 words
    assert ("wait", NPU4.job_timeout_ms.value) in fx.calls
    # data BOs: host_only, synced host->device before the launch; outputs synced back only on read
    data_bos = [c for c in fx.calls if c[0] == "bo"][1:]
    assert data_bos == []        # data BOs were created at upload time, before fx.calls.clear()
    before = names[:names.index("launch")]
    assert before.count("sync") >= 1
    after = [c for c in fx.calls[names.index("wait"):] if c[0] == "sync"]
    assert after == []
    dev.download(out)
    assert fx.calls[-1] == ("sync", "XCL_BO_SYNC_BO_FROM_DEVICE", out.buffer.nbytes)


def test_data_bos_are_host_only_and_synced_to_device(tmp_path):
    fx = FakeXrt()
    dev, _ = xrt_device(tmp_path, fx)
    design, _, ins, out = gemm_case(dev)
    bos = [c for c in fx.calls if c[0] == "bo"]
    assert len(bos) == 4 and all(c[2] == fx.bo.host_only and c[3] == 0 for c in bos)
    install(tmp_path, fx, design, ins, [out])
    fx.calls.clear()
    dev.run(Launch(design, ins, [out]))
    to_dev = [c for c in fx.calls if c[:2] == ("sync", "XCL_BO_SYNC_BO_TO_DEVICE")]
    assert len(to_dev) == 1 + 3           # instruction BO + the three host-written inputs
    fx.calls.clear()
    dev.run(Launch(design, ins, [out]))   # nothing dirty: no syncs, no new context
    assert [c for c in fx.calls if c[0] in ("sync", "hw_context", "xclbin")] == []


def test_missing_sync_would_be_caught(tmp_path):
    """The fake really models device memory: bypassing Device.write's dirty flag is a protocol error."""
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    dev.run(Launch(design, ins, [out]))
    ins[0].buffer.host[:4] = 7            # host write behind the runtime's back
    with pytest.raises(LaunchError, match="not synced") as e:
        dev.run(Launch(design, ins, [out]))
    assert isinstance(e.value.__cause__, ProtocolError)


@pytest.mark.parametrize("state", [ert_cmd_state.ERT_CMD_STATE_ABORT, ert_cmd_state.ERT_CMD_STATE_ERROR])
def test_non_completed_state_raises(tmp_path, state):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    fx.next_states.append(state)
    with pytest.raises(LaunchError, match=state.name) as e:
        dev.run(Launch(design, ins, [out]))
    assert "xdna doctor" in str(e.value) and "2000 ms" in str(e.value)
    dev.run(Launch(design, ins, [out]))   # the device stays usable


def test_context_lru_limit_16(tmp_path):
    dev, fx = xrt_device(tmp_path)
    x = dev.upload(torch.randn(4, 8))
    cases = []
    for i in range(18):                                  # 18 designs, 18 xclbins
        d = VectorDesign("relu", ((4, 8),), (torch.float32,), (4, 8), torch.float32, params=(("i", i),))
        out = dev.empty((4, 8), torch.float32)
        install(tmp_path, fx, d, [x], [out])
        cases.append((d, out))
    for d, out in cases:
        dev.run(Launch(d, [x], [out]))
    assert fx.max_live_contexts == 16 and fx.live_contexts == 16
    assert dev.kernels.opened == 18 and dev.kernels.evicted == 2
    n = dev.kernels.opened
    dev.run(Launch(*cases[-1][:1], [x], [cases[-1][1]]))   # most recent: cached, no new context
    assert dev.kernels.opened == n
    dev.run(Launch(cases[0][0], [x], [cases[0][1]]))       # evicted: reopened, another evicted
    assert dev.kernels.opened == n + 1 and fx.live_contexts == 16
    assert dev.counters.reconfigurations == 19
    torch.testing.assert_close(dev.download(cases[0][1]), dev.download(x).clamp_min(0))
    assert fx.calls.count(("register_xclbin", fx._xclbins and list(fx._xclbins)[0])) == 1


def test_device_opened_once(tmp_path):
    fx = FakeXrt()
    XrtDevice(NPU4, BUDGET, fx, ArtifactStore(tmp_path))
    XrtDevice(NPU4, BUDGET, fx, ArtifactStore(tmp_path))
    assert fx.devices_opened == 1


def test_never_more_bos_than_declared(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out], extra_bo_args=-1)   # kernel declares 3 BOs, ABI has 4
    fx.calls.clear()
    with pytest.raises(LaunchError, match="declares 3"):
        dev.run(Launch(design, ins, [out]))
    assert "launch" not in fx.names()


def test_missing_artifact_is_an_error_not_a_host_run(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    before = out.buffer.host.clone()
    with pytest.raises(ArtifactError, match="no hardware artifact") as e:
        dev.run(Launch(design, ins, [out]))
    assert "TORCH_XDNA_BACKEND=sim" in str(e.value)
    assert "hw_context" not in fx.names() and torch.equal(out.buffer.host, before)


def test_abi_mismatch_is_refused(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    wrong = dev.empty((8, 16), torch.bfloat16)
    with pytest.raises(LaunchError, match="built for float32"):
        dev.run(Launch(design, ins, [wrong]))


def test_elf_flow(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, (a, b, bias), ins, out = gemm_case(dev, m=4, k=16, n=8)
    install(tmp_path, fx, design, ins, [out], flow="elf")
    fx.calls.clear()
    dev.run(Launch(design, ins, [out]))
    names = fx.names()
    order = ["elf", "hw_context", "kernel", "run", "set_arg", "start", "wait"]
    idx = [names.index(n) for n in order]
    assert idx == sorted(idx), names
    assert names.count("set_arg") == 4 and "register_xclbin" not in names and "launch" not in names
    torch.testing.assert_close(dev.download(out), bf16(a) @ bf16(b) + bf16(bias), rtol=1e-5, atol=1e-5)


def test_strided_and_offset_arguments(tmp_path):
    dev, fx = xrt_device(tmp_path)
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(4, 16, generator=g), torch.randn(8, 16, generator=g)   # out = a @ w.T
    a_arg = dev.upload(torch.cat([torch.zeros(2, 16), a]))                    # a sits at row 2
    from torch_xdna.runtime import TensorArg
    a_view = TensorArg(a_arg.buffer, torch.float32, (4, 16), (16, 1), offset=32)
    w_arg = dev.upload(w)
    w_t = TensorArg(w_arg.buffer, torch.float32, (16, 8), (1, 16))            # transposed view
    big = dev.empty((6, 8), torch.float32)
    dev.write(big.buffer, torch.full((6, 8), -1.0))
    out_view = TensorArg(big.buffer, torch.float32, (4, 8), (8, 1), offset=8)  # rows 1..4
    design = GemmDesign(4, 16, 8)
    install(tmp_path, fx, design, [a_view, w_t], [out_view])
    dev.run(Launch(design, [a_view, w_t], [out_view]))
    assert ("sub_bo", 4 * 16 * 4, 32 * 4) in fx.calls and dev.staged_bytes == w.numel() * 4
    res = dev.download(big)
    torch.testing.assert_close(res[1:5], bf16(a) @ bf16(w).T, rtol=1e-5, atol=1e-5)
    assert torch.all(res[0] == -1) and torch.all(res[5] == -1)                # untouched rows kept


def test_strided_output_staged(tmp_path):
    dev, fx = xrt_device(tmp_path)
    x = torch.randn(4, 8)
    xa = dev.upload(x)
    big = dev.empty((8, 4), torch.float32)
    from torch_xdna.runtime import TensorArg
    out_t = TensorArg(big.buffer, torch.float32, (4, 8), (1, 4))             # transposed output
    d = VectorDesign("relu", ((4, 8),), (torch.float32,), (4, 8), torch.float32)
    install(tmp_path, fx, d, [xa], [out_t])
    dev.run(Launch(d, [xa], [out_t]))
    torch.testing.assert_close(dev.download(big), x.clamp_min(0).T)


def test_regroup_to_kernel_memory_group(tmp_path):
    fx = FakeXrt(data_group=2)                 # this xclbin's data args live in group 2
    dev, _ = xrt_device(tmp_path, fx)
    design, (a, b, bias), ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    dev.run(Launch(design, ins, [out]))        # buffers made in group 0 move once; protocol holds
    assert dev.data_group == 2
    torch.testing.assert_close(dev.download(out), bf16(a) @ bf16(b) + bf16(bias), rtol=1e-5, atol=1e-5)
    y = dev.empty((3,), torch.float32)
    assert y.buffer.handle.group == 2


def test_program_and_chained_outputs(tmp_path):
    dev, fx = xrt_device(tmp_path)
    x = torch.randn(4, 8)
    xa = dev.upload(x)
    mid, out = dev.empty((4, 8), torch.float32), dev.empty((4, 8), torch.float32)
    relu = VectorDesign("relu", ((4, 8),), (torch.float32,), (4, 8), torch.float32)
    neg = VectorDesign("neg", ((4, 8),), (torch.float32,), (4, 8), torch.float32)
    install(tmp_path, fx, relu, [xa], [mid])
    install(tmp_path, fx, neg, [mid], [out])
    dev.run_program(Program([Launch(relu, [xa], [mid]), Launch(neg, [mid], [out])], name="p"))
    torch.testing.assert_close(dev.download(out), -x.clamp_min(0))
    assert dev.counters.dispatches == 1 and dev.counters.launches == 2


def test_alloc_failure_names_memlock(tmp_path):
    fx = FakeXrt()
    dev, _ = xrt_device(tmp_path, fx)

    def failing_bo(*a, **k):
        raise RuntimeError("failed to allocate BO")
    failing_bo.host_only = fx.bo.host_only
    fx.bo = failing_bo
    with pytest.raises(Exception, match="ulimit -l"):
        dev.empty((4,), torch.float32)


# --- backend selection -----------------------------------------------------------------------
def test_xrt_required_without_npu_or_pyxrt(monkeypatch):
    """This machine: no /dev/accel/accel0, no pyxrt. TORCH_XDNA_BACKEND=xrt must say so clearly."""
    from torch_xdna import runtime
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
    with pytest.raises(BackendUnavailable) as e:
        runtime.open_backend(runtime.backend_name())
    msg = str(e.value)
    assert "pyxrt" in msg and "/dev/accel/accel0" in msg
    assert "xdna doctor" in msg and "TORCH_XDNA_BACKEND=sim" in msg


def test_auto_falls_back_quickly(monkeypatch):
    import time
    from torch_xdna import runtime
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "auto")
    t0 = time.perf_counter()
    assert open_xrt_device(required=False) is None
    assert time.perf_counter() - t0 < 0.5
    assert runtime.open_backend("auto").backend == "sim"


def test_open_on_fake_healthy_host(tmp_path):
    h = healthy_strix(tmp_path / "root")
    fx = FakeXrt()
    store = ArtifactStore(tmp_path / "art")
    # auto with no artifacts installed: the simulator (every design would be refused otherwise)
    assert open_xrt_device(False, system=h.system(), pyxrt=fx, artifacts=store) is None
    dev = open_xrt_device(True, system=h.system(), pyxrt=fx, artifacts=store)
    assert isinstance(dev, XrtDevice) and dev.gen.name == "npu4" and dev.backend == "xrt"
    h.node(mode=0o600)                                   # the user loses access
    with pytest.raises(BackendUnavailable, match="not read-write"):
        open_xrt_device(True, system=h.system(), pyxrt=fx, artifacts=store)
    assert open_xrt_device(False, system=h.system(), pyxrt=fx, artifacts=store) is None


def test_backend_does_not_import_upper_layers():
    """runtime/xrt/ may import hw/ and runtime/ only (never the torch device, kernels, engine, cli)."""
    import ast
    from pathlib import Path
    import torch_xdna.runtime.xrt as pkg
    allowed = ("torch_xdna.hw", "torch_xdna.runtime", "torch_xdna.array")
    for f in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for m in mods:
                if m.startswith("torch_xdna"):
                    assert m.startswith(allowed), f"{f.name} imports {m}"


def test_view_outliving_free_keeps_bo_alive(tmp_path):
    dev, fx = xrt_device(tmp_path)
    arg = dev.upload(torch.arange(16, dtype=torch.float32))
    view = dev.read(arg.buffer)[:8]
    dev.free(arg.buffer)
    assert dev.counters.allocated_bytes == 0 and arg.buffer.host.numel() == 0
    assert view.view(torch.float32).tolist() == [0.0, 1.0]     # still backed by the (kept) mapping


# --- hardware-path fixes (issue [kernels] item 4), each against the fake pyxrt -------------------
def test_timeout_aborts_and_marks_device_unusable(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    fx.next_states.append(ert_cmd_state.ERT_CMD_STATE_TIMEOUT)
    with pytest.raises(LaunchError, match="ERT_CMD_STATE_TIMEOUT") as e:
        dev.run(Launch(design, ins, [out]))
    assert "was aborted" in str(e.value) and "unusable" in str(e.value)
    assert ("abort",) in fx.calls
    fx.calls.clear()
    with pytest.raises(LaunchError, match="unusable until it is reset"):   # never treated as free
        dev.run(Launch(design, ins, [out]))
    assert "launch" not in fx.names()
    held = out.buffer.handle
    dev.free(out.buffer)                        # the hung command may still write this BO: kept
    assert held in dev._held_after_timeout


def test_timeout_without_run_abort_still_refuses(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    fx.next_states.append(RuntimeError("wait timed out"))     # some releases raise instead
    with pytest.raises(LaunchError, match="waiting for the command failed"):
        dev.run(Launch(design, ins, [out]))
    assert dev.unusable


def test_context_creation_error_is_a_launch_error(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])

    def broken_kernel(ctx, name):
        raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-22)")
    fx.kernel = broken_kernel
    with pytest.raises(LaunchError, match="CREATE_HWCTX") as e:
        dev.run(Launch(design, ins, [out]))
    assert "xdna doctor" in str(e.value)


def test_binding_error_is_a_launch_error(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    dev.run(Launch(design, ins, [out]))
    lk = next(iter(dev.kernels._kernels.values()))
    lk._groups.clear()

    def bad_group(i):
        raise RuntimeError("bad argument index")
    lk.kernel.group_id = bad_group
    with pytest.raises(LaunchError, match="binding its arguments failed: bad argument index"):
        dev.run(Launch(design, ins, [out]))


def test_context_pool_exhausted_by_others_evicts_own_and_retries(tmp_path):
    fx = FakeXrt(external_contexts=14)          # other processes hold 14 of the 16
    dev, _ = xrt_device(tmp_path, fx)
    x = dev.upload(torch.randn(4, 8))
    cases = []
    for i in range(3):
        d = VectorDesign("relu", ((4, 8),), (torch.float32,), (4, 8), torch.float32, params=(("i", i),))
        o = dev.empty((4, 8), torch.float32)
        install(tmp_path, fx, d, [x], [o])
        cases.append((d, o))
    for d, o in cases:
        dev.run(Launch(d, [x], [o]))            # the third fails once, ours are released, retried
    assert dev.kernels.pool_retries == 1 and fx.live_contexts == 1
    torch.testing.assert_close(dev.download(cases[2][1]), dev.download(x).clamp_min(0))


def test_context_pool_exhausted_names_the_limit(tmp_path):
    from torch_xdna.runtime.xrt.session import ContextPoolExhausted
    fx = FakeXrt(external_contexts=16)
    dev, _ = xrt_device(tmp_path, fx)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out])
    with pytest.raises(ContextPoolExhausted, match="16 hardware contexts shared by all processes"):
        dev.run(Launch(design, ins, [out]))


def test_elf_flow_on_xrt_220_is_explained(tmp_path):
    fx = FakeXrt(elf_context=False)
    dev, _ = xrt_device(tmp_path, fx)
    design, _, ins, out = gemm_case(dev, m=4, k=16, n=8)
    install(tmp_path, fx, design, ins, [out], flow="elf")
    with pytest.raises(BackendUnavailable, match=r"hw_context\(device, elf\).*XRT 2.23"):
        dev.run(Launch(design, ins, [out]))


def test_capabilities_probe_reads_pybind_overloads():
    from torch_xdna.runtime.xrt.session import capabilities

    class Doc220:
        class hw_context:
            def __init__(self, *a):
                """__init__(*args, **kwargs)\nOverloaded function.\n\n1. __init__(self: pyxrt.hw_context) -> None\n\n2. __init__(self: pyxrt.hw_context, arg0: pyxrt.device, arg1: pyxrt.uuid) -> None"""
        class run:
            def wait(self):
                pass
    class Doc223(Doc220):
        class hw_context:
            def __init__(self, *a):
                """__init__(*args, **kwargs)\nOverloaded function.\n\n1. __init__(self: pyxrt.hw_context, arg0: pyxrt.device, arg1: pyxrt.uuid) -> None\n\n2. __init__(self: pyxrt.hw_context, arg0: pyxrt.device, arg1: pyxrt.elf) -> None"""
        elf = object
    assert capabilities(Doc220)["elf_context"] is False and capabilities(Doc220)["run_abort"] is False
    assert capabilities(Doc223)["elf_context"] is True
    assert capabilities(FakeXrt())["elf_context"] is None          # no pybind docs: unknown


def test_scalars_travel_in_the_stream_never_as_kernel_args(tmp_path):
    from torch_xdna.kernels.ops.dma import GatherDesign
    dev, fx = xrt_device(tmp_path)
    design, _, ins, out = gemm_case(dev)
    install(tmp_path, fx, design, ins, [out], scalars=[("alpha", "float32"), ("rows", "int32")])
    fx.calls.clear()
    dev.run(Launch(design, ins, [out], scalars={"alpha": 0.5, "rows": 8}))
    assert not [c for c in fx.calls if c[0] == "dropped_arg"]
    launch = next(c for c in fx.calls if c[0] == "launch")
    assert launch[3] == 4                                   # 4 BOs, no scalar argument
    n_bo = len([c for c in fx.calls if c[0] == "bo"])
    dev.run(Launch(design, ins, [out], scalars={"alpha": 0.5, "rows": 8}))
    assert len([c for c in fx.calls if c[0] == "bo"]) == n_bo      # patched stream cached
    for bad, msg in [({"alpha": 0.5, "rows": 2 ** 31}, "outside int32"),
                     ({"alpha": 0.5, "rows": 1.5}, "must be an integer"),
                     ({"alpha": 1e39, "rows": 1}, "does not fit float32"),
                     ({"rows": 1}, "'alpha' required")]:
        with pytest.raises(LaunchError, match=msg):
            dev.run(Launch(design, ins, [out], scalars=bad))


def test_scalar_patch_value_reaches_the_kernel(tmp_path):
    dev, fx = xrt_device(tmp_path)
    x = dev.upload(torch.tensor([1.0, -2.0, 3.0]))
    o = dev.empty((3,), torch.float32)
    d = VectorDesign("relu", ((3,),), (torch.float32,), (3,), torch.float32)
    install(tmp_path, fx, d, [x], [o], scalars=[("n", "int32")])
    seen = []
    ref = fx.computes[d.artifact_key()]
    fx.computes[d.artifact_key()] = lambda args, instr: (seen.append(instr), ref(args, instr))
    dev.run(Launch(d, [x], [o], scalars={"n": 7}))
    dev.run(Launch(d, [x], [o], scalars={"n": -3}))
    import struct
    art = dev.artifacts.lookup(d.artifact_key(), "npu4")
    w = art.abi[-1].patch
    assert [struct.unpack_from("<i", s, 4 * w)[0] for s in seen] == [7, -3]


def test_scalar_without_patch_refused_at_validation(tmp_path):
    import json
    fx = FakeXrt()
    dev, _ = xrt_device(tmp_path, fx)
    design, _, ins, out = gemm_case(dev)
    d = install(tmp_path, fx, design, ins, [out], scalars=[("alpha", "float32")])
    m = json.loads((d / "manifest.json").read_text())
    m["abi"][-1].pop("patch")
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="no instruction-stream patch word"):
        dev.run(Launch(design, ins, [out], scalars={"alpha": 1.0}))


def test_operands_converted_to_the_kernels_dtype(tmp_path):
    dev, fx = xrt_device(tmp_path)
    design, (a, b, bias), ins, out = gemm_case(dev)
    # the kernel takes bf16 A and B (float32 tensors in the launch), bias as float32
    install(tmp_path, fx, design, ins, [out], kernel_dtypes={0: torch.bfloat16, 1: torch.bfloat16})
    art = dev.artifacts.lookup(design.artifact_key(), "npu4")
    assert [s.dtype for s in art.abi] == ["bfloat16", "bfloat16", "float32", "float32"]
    fx.calls.clear()
    seen = {}
    ref = fx.computes[design.artifact_key()]

    def spy(args, instr):
        seen["sizes"] = [a.size for a in args]
        ref(args, instr)
    fx.computes[design.artifact_key()] = spy
    dev.run(Launch(design, ins, [out]))
    assert seen["sizes"][:2] == [8 * 32 * 2, 32 * 16 * 2]        # bf16 BOs handed to the kernel
    torch.testing.assert_close(dev.download(out), bf16(a) @ bf16(b) + bf16(bias), rtol=1e-5, atol=1e-5)


def test_uuid_forms_compared_canonically(tmp_path):
    import json
    from torch_xdna.runtime.xrt.artifacts import canonical_uuid
    assert canonical_uuid("0123456789ABCDEF0123456789abcdef") == "01234567-89ab-cdef-0123-456789abcdef"
    assert canonical_uuid("{01234567-89AB-CDEF-0123-456789ABCDEF}") == "01234567-89ab-cdef-0123-456789abcdef"
    assert canonical_uuid("not-a-uuid") is None
    for form in (str.upper, lambda u: u.replace("-", "")):
        fx = FakeXrt()
        dev, _ = xrt_device(tmp_path / form.__name__, fx)
        design, _, ins, out = gemm_case(dev)
        d = make_artifact(tmp_path / form.__name__ / "art", fx, design, NPU4, ins, [out])
        m = json.loads((d / "manifest.json").read_text())
        m["xclbin_uuid"] = form(m["xclbin_uuid"])
        (d / "manifest.json").write_text(json.dumps(m))
        dev.run(Launch(design, ins, [out]))                 # accepted: same UUID, other spelling


@pytest.mark.parametrize("corrupt,msg", [("size", "header says"), ("gen", "device generation 3"),
                                         ("short", "too short")])
def test_stream_header_checked_before_submission(tmp_path, corrupt, msg):
    import struct
    from fake_pyxrt import fake_stream
    fx = FakeXrt()
    dev, _ = xrt_device(tmp_path, fx)
    design, _, ins, out = gemm_case(dev)
    stream, _ = fake_stream(NPU4, dev_gen=3 if corrupt == "gen" else None)
    if corrupt == "size":
        stream = stream + b"\0" * 8
    if corrupt == "short":
        stream = stream[:8]
    install(tmp_path, fx, design, ins, [out], insts=stream)
    fx.calls.clear()
    with pytest.raises(ArtifactError, match=msg):
        dev.run(Launch(design, ins, [out]))
    assert "hw_context" not in fx.names() and "launch" not in fx.names()
