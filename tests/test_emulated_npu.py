"""The emulated NPU behind the pyxrt API (runtime/xrt/emulated): artifacts from `xdna kernels build`
(fake toolchain wrapping our MLIR + stream) run through the xrt backend, their instruction streams
executed at the transaction level with the host-compiled C++ core kernels; the driver's errors
(missing sync, wrong group, corrupted stream, lost instruction BO); the kernel-order reference;
`xdna selftest` on it. Every result here is emulated, none is a hardware result."""
from __future__ import annotations

import dataclasses
import gc
import json
import struct
from pathlib import Path

import pytest
import torch

import fake_toolchain
from torch_xdna.array.bd import AccessPattern
from torch_xdna.array import ir, mlir
from torch_xdna.cli.main import main
from torch_xdna.hw import NPU4
from torch_xdna.kernels import numerics
from torch_xdna.kernels.aie import host_build, host_kernels
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.toolchain import catalog
from torch_xdna.runtime import Launch
from torch_xdna.runtime.sim import SimDevice
from torch_xdna.runtime.xrt import emulated, open_xrt_device
from torch_xdna.runtime.xrt.artifacts import ArtifactStore
from torch_xdna.runtime.xrt.emulated.program import load_program
from torch_xdna.runtime.xrt.session import release_devices

pytestmark = pytest.mark.skipif(host_build.find_compiler() is None,
                                reason="no host C++ compiler for the core kernels")
CHECKS = (("add_one", "1024", None), ("gemm", "64x64x64", None), ("gemm", "64x64x64", "int8"),
          ("gemm", "1x256x256", None))          # a decode GEMV: mem-tile padding, first-rows store
TO_DEV = emulated.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE
FROM_DEV = emulated.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Artifacts for the selftest's designs (and an int8 GEMM), built by `xdna kernels build`."""
    root = tmp_path_factory.mktemp("emu")
    with pytest.MonkeyPatch.context() as mp:
        fake_toolchain.install(root / "tc", mp)
        for name, shape, dtype in CHECKS:
            argv = ["kernels", "build", "--design", name, "--shape", shape,
                    "--artifact-dir", str(root / "store"), "--json"]
            assert main(argv + (["--dtype", dtype] if dtype else [])) == 0
    return root / "store"


@pytest.fixture
def emulated_env(store, monkeypatch):
    release_devices()
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
    monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(store))
    monkeypatch.delenv("TORCH_XDNA_GEMM_ORDER", raising=False)
    yield store
    release_devices()


def _inputs(ex, seed):
    """ex.tensors, with int8 operands in int8's range (catalog draws from +-1000)."""
    if all(dt != torch.int8 for _, dt in ex.inputs):
        return ex.tensors(seed)[0]
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-128, 128, s, generator=g, dtype=dt) for s, dt in ex.inputs]


def _run(dev, ex, ins):
    in_args = [dev.upload(t) for t in ins]
    out_args = [dev.empty(tuple(s), dt) for s, dt in ex.outputs]
    dev.run(Launch(ex.design, in_args, out_args, dict(ex.scalars), op="test"))
    return [dev.download(a) for a in out_args]


# --- the array configuration: our MLIR read back ------------------------------------------------
def _normal(p: ir.ArrayProgram) -> ir.ArrayProgram:
    """What the MLIR spells: task ids in issue order, one await per task, no notes or name."""
    ids = {t.id: i for i, t in enumerate(p.sequence.tasks)}
    ops = []
    for op in p.sequence.ops:
        if isinstance(op, ir.DmaTask):       # the access pattern in its printed (canonical) form
            pat = AccessPattern.of(op)
            pat = AccessPattern.from_printed(pat.offset, pat.printed_dims, pat.repeat_count)
            ops.append(dataclasses.replace(op, id=ids[op.id], sizes=pat.sizes, strides=pat.strides,
                                           repeat=pat.repeat))
        elif isinstance(op, (ir.Await, ir.Free)):
            ops.extend(type(op)((ids[t],)) for t in op.tasks)
        else:
            ops.append(op)
    fifos = tuple(dataclasses.replace(f, dims_from_stream=f.dims_from_stream if any(f.dims_from_stream)
                                      else ()) for f in p.fifos)
    return dataclasses.replace(p, name="", generation="", notes=(), fifos=fifos,
                               sequence=dataclasses.replace(p.sequence, ops=tuple(ops)))


@pytest.mark.parametrize("name,shape,dtype", [
    ("add_one", "1024", None), ("gemm", "64x64x64", None), ("gemm", "256x128x64", "int8"),
    ("gemm_bias", "64x64x64", None), ("relu", "32x512", None), ("softmax", "32x512", "bfloat16"),
    ("gelu", "1024", None), ("gemm", "1x256x256", None)])    # last: a decode GEMV (mem-tile padDimensions)
def test_mlir_reads_back_into_the_same_program(name, shape, dtype):
    """The emulated 'compiler' reconstructs the whole ArrayProgram from the MLIR the chip build
    hands aiecc.py, shim channels and runtime-parameter buffers included."""
    p = lower(catalog.example(name, shape, dtype).design, NPU4)[0]
    assert _normal(load_program(mlir.to_mlir(p, NPU4.arch), "x", "y")) == _normal(p)


# --- through the xrt backend --------------------------------------------------------------------
@pytest.mark.parametrize("name,shape,dtype", CHECKS, ids=lambda x: str(x))
def test_designs_through_the_xrt_backend_equal_the_kernel_order_reference(emulated_env, name, shape, dtype):
    dev = open_xrt_device(True)
    assert dev.xrt is emulated and dev.gen.name == emulated.GENERATION
    ex = catalog.example(name, shape, dtype)
    ins = _inputs(ex, 3)
    got = _run(dev, ex, ins)
    with numerics.use_gemm_order("kernel"):
        want = _run(SimDevice(dev.gen, dev.memory_budget), ex, ins)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_kernel_order_differs_from_the_plan_order_where_the_issue_says(emulated_env):
    """The default functional level (plan order) is not what the C++ kernel computes; the
    kernel order is (the 64^3 GEMM of the selftest; int8 is exact in any order)."""
    ex = catalog.example("gemm", "64x64x64")
    ins, _ = ex.tensors(seed=7)
    sim = SimDevice(NPU4, 64 << 20)
    plan = _run(sim, ex, ins)[0]
    with numerics.use_gemm_order("kernel"):
        kern = _run(sim, ex, ins)[0]
    differ = int((plan != kern).sum())
    assert 0 < differ < plan.numel() and float((plan - kern).abs().max()) < 1e-5
    assert torch.equal(_run(open_xrt_device(True), ex, ins)[0], kern)
    ex8 = catalog.example("gemm", "64x64x64", "int8")
    ins8 = _inputs(ex8, 7)
    with numerics.use_gemm_order("kernel"):
        k8 = _run(sim, ex8, ins8)[0]
    assert torch.equal(k8, _run(sim, ex8, ins8)[0])
    assert torch.equal(k8, _run(open_xrt_device(True), ex8, ins8)[0])


def test_kernel_order_is_selectable_by_environment(monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_GEMM_ORDER", "kernel")
    assert numerics.gemm_order() == "kernel"
    with numerics.use_gemm_order("plan"):
        assert numerics.gemm_order() == "plan"
    monkeypatch.setenv("TORCH_XDNA_GEMM_ORDER", "nope")
    with pytest.raises(ValueError, match="kernel"):
        numerics.gemm_order()


def test_auto_without_artifacts_stays_on_the_simulator(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(tmp_path / "none"))
    assert open_xrt_device(False) is None


# --- the pyxrt API directly: the driver's errors ------------------------------------------------
class Launcher:
    """mlir-aie's host code for one installed artifact, on the emulated pyxrt."""

    def __init__(self, store: Path, name: str, shape: str, strict: bool = False):
        self.ex = catalog.example(name, shape)
        d = store / self.ex.design.artifact_key()
        self.manifest = json.loads((d / "manifest.json").read_text())
        self.dev = emulated.npu.device(0, strict=strict)
        xb = emulated.xclbin(str(d / self.manifest["files"]["xclbin"]["path"]))
        self.dev.register_xclbin(xb)
        self.ctx = emulated.hw_context(self.dev, xb.get_uuid())
        self.k = emulated.kernel(self.ctx, "MLIR_AIE")
        self.insts = (d / self.manifest["files"]["insts"]["path"]).read_bytes()
        self.instr = emulated.bo(self.dev, len(self.insts), emulated.bo.cacheable, self.k.group_id(1))
        self.instr.map()[:] = self.insts
        self.instr.sync(TO_DEV)

    def bos(self, tensors, group_of=None):
        group_of = group_of or (lambda i: self.k.group_id(3 + i))
        out = []
        for i, t in enumerate(tensors):
            raw = t.contiguous().view(-1).view(torch.uint8)
            b = emulated.bo(self.dev, raw.numel(), emulated.bo.host_only, group_of(i))
            b.map()[:] = raw.numpy().tobytes()
            b.sync(TO_DEV)
            out.append(b)
        return out

    def __call__(self, *bos):
        return self.k(3, self.instr, len(self.insts) // 4, *bos)


def _read(b, like):
    b.sync(FROM_DEV)
    return torch.frombuffer(bytearray(b.map()), dtype=like.dtype).reshape(like.shape)


def test_missing_sync_computes_on_stale_device_memory(store):
    L = Launcher(store, "add_one", "1024")
    x = torch.arange(1024, dtype=torch.int32)
    one = torch.ones((), dtype=torch.int32)
    out = torch.zeros(1024, dtype=torch.int32)
    bx, b1, bo = L.bos([x, one, out])
    assert L(bx, b1, bo).wait(1000) == emulated.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert torch.equal(_read(bo, out), x + 1)
    bx.map()[:] = (x * 10).numpy().tobytes()         # written on the host, never synced
    assert L(bx, b1, bo).wait(1000) == emulated.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    stale = _read(bo, out)
    assert torch.equal(stale, x + 1) and not torch.equal(stale, x * 10 + 1)
    bo.sync(TO_DEV)                                   # results invisible until FROM_DEVICE
    bx.sync(TO_DEV)
    assert L(bx, b1, bo).wait(1000) == emulated.ert_cmd_state.ERT_CMD_STATE_COMPLETED
    assert torch.frombuffer(bytearray(bo.map()), dtype=torch.int32)[5] == 6
    assert torch.equal(_read(bo, out), x * 10 + 1)


def test_strict_mode_names_the_unsynced_bo(store):
    L = Launcher(store, "add_one", "1024", strict=True)
    bx, b1, bo = L.bos([torch.zeros(1024, dtype=torch.int32), torch.ones((), dtype=torch.int32),
                        torch.zeros(1024, dtype=torch.int32)])
    b1.map()[:] = struct.pack("<i", 5)
    with pytest.raises(RuntimeError, match=r"argument 4 \(4-byte BO\) was written on the host but not synced"):
        L(bx, b1, bo)


def test_wrong_group_is_refused_naming_argument_and_group(store):
    L = Launcher(store, "add_one", "1024")
    bx, b1, bo = L.bos([torch.zeros(1024, dtype=torch.int32), torch.ones((), dtype=torch.int32),
                        torch.zeros(1024, dtype=torch.int32)], group_of=lambda i: 1 if i == 1 else 0)
    with pytest.raises(RuntimeError, match=r"global argument at index 4 .*memory group 1, "
                                           r"kernel.group_id\(4\) is 0"):
        L(bx, b1, bo)
    bad = emulated.bo(L.dev, 64, emulated.bo.host_only, 1)
    with pytest.raises(RuntimeError, match="argument 1: the instruction BO has flags host_only"):
        L.k(3, bad, 16, bx, b1, bo)


def test_corrupted_stream_ends_in_error_naming_the_opcode(store, caplog):
    L = Launcher(store, "add_one", "1024")
    bos = L.bos([torch.zeros(1024, dtype=torch.int32), torch.ones((), dtype=torch.int32),
                 torch.zeros(1024, dtype=torch.int32)])
    words = bytearray(L.insts)
    words[16] = 0x7F                                   # first op's opcode byte
    L.instr.map()[:] = bytes(words)
    L.instr.sync(TO_DEV)
    r = L(*bos)
    assert r.wait(1000) == emulated.ert_cmd_state.ERT_CMD_STATE_ERROR
    assert "unknown opcode 0x7F at word 4" in r.error_detail
    assert "unknown opcode 0x7F" in caplog.text


def test_unsynced_instruction_bo_is_a_broken_stream(store):
    L = Launcher(store, "add_one", "1024")
    instr = emulated.bo(L.dev, len(L.insts), emulated.bo.cacheable, 1)
    instr.map()[:] = L.insts                           # never synced: the device sees zeros
    bos = L.bos([torch.zeros(1024, dtype=torch.int32), torch.ones((), dtype=torch.int32),
                 torch.zeros(1024, dtype=torch.int32)])
    r = L.k(3, instr, len(L.insts) // 4, *bos)
    assert r.wait(1000) == emulated.ert_cmd_state.ERT_CMD_STATE_ERROR
    assert "transaction header" in r.error_detail


def test_lost_instruction_bo_is_an_error(store):
    L = Launcher(store, "add_one", "1024")
    bos = L.bos([torch.zeros(1024, dtype=torch.int32), torch.ones((), dtype=torch.int32),
                 torch.zeros(1024, dtype=torch.int32)])
    r = L(*bos)
    L.instr = None                                     # the last reference: the BO is freed
    gc.collect()
    assert r.wait(1000) == emulated.ert_cmd_state.ERT_CMD_STATE_ERROR
    assert "the instruction BO (argument 1)" in r.error_detail and "freed" in r.error_detail
    with pytest.raises(TypeError, match="argument 1: expected the instruction BO"):
        L.k(3, None, 16, *bos)


def test_backend_error_carries_the_emulated_fault(emulated_env, monkeypatch):
    """Through XrtDevice: the LaunchError names the fault the emulated firmware hit."""
    from torch_xdna.runtime.errors import LaunchError
    dev = open_xrt_device(True)
    ex = catalog.example("add_one", "1024")
    ins, _ = ex.tensors()
    real = emulated.npu.run._execute

    def corrupt(self):
        self.dev.table.get(self.instr.handle).device[16] = 0x7F
        return real(self)
    monkeypatch.setattr(emulated.npu.run, "_execute", corrupt)
    with pytest.raises(LaunchError, match="ERT_CMD_STATE_ERROR.*unknown opcode 0x7F"):
        _run(dev, ex, ins)


# --- xdna selftest on the emulated NPU ----------------------------------------------------------
def test_selftest_passes_on_the_emulated_npu(emulated_env, tmp_path, capsys):
    receipt = tmp_path / "r.json"
    assert main(["selftest", "--receipt", str(receipt)]) == 0
    out = capsys.readouterr().out
    assert "selftest passed on the emulated NPU" in out and "not a hardware result" in out
    r = json.loads(receipt.read_text())
    assert r["ok"] and r["emulated"] and not r["hardware"]
    gemm = r["checks"][1]
    assert gemm["bit_exact"] and gemm["ulp_to_fast_reference"] > 0     # plan order != kernel order


def test_selftest_names_the_mismatch_of_a_perturbed_kernel(emulated_env, capsys):
    with host_kernels.perturbed("matmul_bf16_f32"):
        rc = main(["selftest", "--json"])
    r = json.loads(capsys.readouterr().out)
    assert rc == 1 and not r["ok"]
    add, gemm = r["checks"]
    assert add["bit_exact"] and not gemm["bit_exact"]
    assert gemm["mismatches"] > 0 and gemm["first_mismatch"]["index"] == 0


# --- an eager workload --------------------------------------------------------------------------
def test_eager_matmul_runs_on_the_emulated_npu(emulated_env):
    """`a.to("xdna") @ b.to("xdna")` through the xrt backend on the emulated NPU (the artifact of
    its GEMM design built above): bit-identical to the kernel-order reference."""
    from torch_xdna.kernels.ops.gemm import GemmDesign
    from torch_xdna.runtime import set_device_for_testing
    dev = open_xrt_device(True)
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    prev = set_device_for_testing(dev)
    try:
        got = (a.to("xdna") @ b.to("xdna")).cpu()
    finally:
        set_device_for_testing(prev)
    assert dev.counters.launches == 1
    want = torch.zeros(64, 64)
    with numerics.use_gemm_order("kernel"):
        GemmDesign(64, 64, 64).reference([a, b], [want])
    assert torch.equal(got, want)
