"""Staged artifacts end to end: `xdna kernels build` (fake toolchain: the xclbin built as an
aiecc.py --xclbin-input chain, one kernel per configuration) -> the backend's validator -> the
xrt backend running the stages in sequence on the emulated NPU (scratch BOs between stages,
per-launch streams, one hardware context), bit-identical to the kernel-order reference; the
driver's errors on staged runs. Every result here is emulated, none is a hardware result.

The design is a test design of two stages from catalog lowerings (GEMM A @ B -> scratch T, relu
T -> C), the add_one_two shape: the decoder layer and head of every model shape are refused by
the MLIR printer today (shim-DMA zero padding in their GEMV and attention stages), so no fused
engine design can be built for the chip yet; see docs/hardware.md section 7."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import fake_toolchain
from torch_xdna.cli.main import main
from torch_xdna.hw import NPU4
from torch_xdna.kernels import numerics
from torch_xdna.kernels.aie import host_build, host_kernels
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.lower import dispatch
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.kernels.toolchain import catalog, launch_abi
from torch_xdna.kernels.toolchain.build import BuildError, find_toolchain
from torch_xdna.kernels.toolchain.staged import build_design
from torch_xdna.runtime import Launch
from torch_xdna.runtime.errors import LaunchError
from torch_xdna.runtime.xrt import emulated, open_xrt_device
from torch_xdna.runtime.xrt.artifacts import ArtifactStore
from torch_xdna.runtime.xrt.session import release_devices

pytestmark = pytest.mark.skipif(host_build.find_compiler() is None,
                                reason="no host C++ compiler for the core kernels")
M = K = N = 64


@dataclasses.dataclass(frozen=True)
class GemmRelu(Design):
    """C = relu(A @ B): two array programs, the second's stream made per launch."""

    kind: str = "test.gemm_relu"
    per_launch: bool = True

    @property
    def name(self) -> str:
        return "test.gemm_relu"

    def reference(self, inputs, outputs, scalars=None) -> None:
        t = torch.zeros(M, N)
        GemmDesign(M, K, N).reference(inputs, [t])
        outputs[0].copy_(torch.relu(t))


def _lower(d, gen, **_):
    g = dispatch.lower_stage(GemmDesign(M, K, N), gen)
    r = dispatch.lower_stage(VectorDesign("relu", ((M, N),), (torch.float32,), (M, N),
                                          torch.float32), gen)
    g = dispatch.rename_args(g, {"C": "T"}, {"launch_args": ("A", "B", "C"),
                                             "scratch_args": ("T",), "stage": "gemm"})
    notes = {"scratch_args": ("T",), "stage": "relu"}
    if d.per_launch:
        notes["per_launch_stream"] = True
    return g, dispatch.rename_args(r, {"in0": "T", "out0": "C"}, notes)


def _example(per_launch: bool = True) -> catalog.Example:
    return catalog.Example(GemmRelu(per_launch=per_launch), (((M, K), torch.float32),
                                                             ((K, N), torch.float32)),
                           (((M, N), torch.float32),))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Both variants built into one store by the fake toolchain; (store, argv log)."""
    root = tmp_path_factory.mktemp("staged")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(dispatch.LOWERINGS, "test.gemm_relu", _lower)
        log = fake_toolchain.install(root / "tc", mp)
        tc = find_toolchain()
        for per_launch in (True, False):
            build_design(_example(per_launch), NPU4, tc, root / "store")
        calls = fake_toolchain.calls(log)
    return root / "store", calls


@pytest.fixture
def device(built, monkeypatch):
    monkeypatch.setitem(dispatch.LOWERINGS, "test.gemm_relu", _lower)
    release_devices()
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
    monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(built[0]))
    yield open_xrt_device(True)
    release_devices()


def _want(a, b):
    t = torch.zeros(M, N)
    with numerics.use_gemm_order("kernel"):
        GemmDesign(M, K, N).reference([a, b], [t])
    return torch.relu(t)


def _run(dev, d, a, b):
    out = dev.empty((M, N), torch.float32)
    dev.run(Launch(d, [dev.upload(a), dev.upload(b)], [out], {}, op="test"))
    return dev.download(out)


def test_build_chains_one_kernel_per_configuration_into_one_xclbin(built):
    store, calls = built
    aiecc = [c for c in calls if c[0] == "aiecc.py" and "--version" not in c]
    assert len(aiecc) == 4                                     # 2 designs x 2 configurations
    first, second = aiecc[:2]
    k0 = next(a for a in first if a.startswith("--xclbin-kernel-name="))
    assert "--xclbin-kernel-id=0x901" in first and not any(a.startswith("--xclbin-input") for a in first)
    assert "--xclbin-kernel-id=0x902" in second and "--xclbin-input=stage0.xclbin" in second
    assert f"--xclbin-instance-name={k0.split('=')[1]}INST" in first
    for per_launch in (True, False):
        d = _example(per_launch).design
        m = json.loads((store / d.artifact_key() / "manifest.json").read_text())
        assert m["flow"] == "staged"
        assert [s["stream"] for s in m["launch"]["stages"]] == ["fixed", "host" if per_launch else "fixed"]
        assert set(m["files"]) == {"xclbin", "insts.0"} | (set() if per_launch else {"insts.1"})
        assert [b["role"] for b in m["launch"]["buffers"]] == ["input", "input", "output", "scratch"]
        assert m["launch"]["buffers"][0]["kernel_dtype"] == "bfloat16"     # rounded on the host
        art = ArtifactStore(store).validate(d.artifact_key(), "npu4", d.name)   # the backend's check
        assert art.launch.kernel_runs == 2 and art.launch.configure_points() == 2
        xb = emulated.xclbin(str(art.files["xclbin"]))
        assert [k.get_name() for k in xb.get_kernels()] == [s.kernel for s in art.launch.stages]


@pytest.mark.parametrize("per_launch", [True, False], ids=["host-stream", "fixed-streams"])
def test_staged_launch_on_the_emulated_npu_equals_the_kernel_order_reference(device, per_launch):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    d = _example(per_launch).design
    got = _run(device, d, a, b)
    assert torch.equal(got, _want(a, b)) and (got == 0).any() and (got > 0).any()
    assert device.kernels.opened == 1                          # one hardware context
    a2 = torch.randn(M, K, generator=g)                        # scratch reused, inputs re-synced
    assert torch.equal(_run(device, d, a2, b), _want(a2, b))


def test_a_perturbed_stage_kernel_is_seen(device):
    """The second stage really runs the host-compiled C++ relu (perturbed: results differ)."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    with host_kernels.perturbed("matmul_bf16_f32"):
        got = _run(device, _example().design, a, b)
    assert not torch.equal(got, _want(a, b))


def test_corrupted_per_launch_stream_names_the_stage(device, monkeypatch):
    real = emulated.npu.run._execute

    def corrupt(self):
        if self.k.name == device.artifacts.lookup(GemmRelu().artifact_key(), "npu4").launch.stages[1].kernel:
            self.dev.table.get(self.instr.handle).device[16] = 0x7F
        return real(self)
    monkeypatch.setattr(emulated.npu.run, "_execute", corrupt)
    g = torch.Generator().manual_seed(3)
    with pytest.raises(LaunchError, match=r"stage 1 \(relu.*ERT_CMD_STATE_ERROR.*unknown opcode 0x7F"):
        _run(device, GemmRelu(), torch.randn(M, K, generator=g), torch.randn(K, N, generator=g))


def test_lost_instruction_bo_of_a_stage_is_an_error(device, monkeypatch):
    real = emulated.npu.run._execute

    def lose(self):
        self.dev.table.free(self.instr.handle)
        return real(self)
    monkeypatch.setattr(emulated.npu.run, "_execute", lose)
    with pytest.raises(LaunchError, match=r"stage 0 \(gemm.*ERT_CMD_STATE_ERROR.*instruction BO.*freed"):
        _run(device, GemmRelu(), torch.ones(M, K), torch.ones(K, N))


def test_wrong_group_of_a_stage_argument_is_refused(device):
    d = GemmRelu()
    art = device.artifacts.lookup(d.artifact_key(), "npu4")
    device.kernels.get(art)
    bo, _ = device.staged_state.scratch[(art.key, "T")] = device._new_bo(M * N * 4, 1)   # SRAM group
    with pytest.raises(LaunchError, match=r"stage 0 \(gemm.*global argument at index 5 .*memory "
                                          r"group 1, kernel.group_id\(5\) is 0"):
        _run(device, d, torch.ones(M, K), torch.ones(K, N))


def test_missing_sync_is_named_in_strict_mode_for_a_stage(built, monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_XRT_DEBUG", "1")
    monkeypatch.setitem(dispatch.LOWERINGS, "test.gemm_relu", _lower)
    release_devices()
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
    monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(built[0]))
    dev = open_xrt_device(True)
    a, b = dev.upload(torch.ones(M, K)), dev.upload(torch.ones(K, N))
    out = dev.upload(torch.full((M, N), 7.0))        # written on the host...
    real_sync = dev._sync                            # ...and the sync to the device forgotten
    monkeypatch.setattr(dev, "_sync", lambda buf, to_device: None if to_device else real_sync(buf, False))
    try:
        with pytest.raises(LaunchError, match=r"stage 1 \(relu.*argument 4 .*written on the host "
                                              r"but not synced"):
            dev.run(Launch(GemmRelu(), [a, b], [out], {}, op="test"))
    finally:
        release_devices()


def _lower_padded(d, gen, **kw):
    """The same stages, the relu stage's first shim task zero-padding (no mlir-aie form)."""
    g, r = _lower(d, gen, **kw)
    ops = list(r.sequence.ops)
    i = next(i for i, op in enumerate(ops) if hasattr(op, "pad_after"))
    ops[i] = dataclasses.replace(ops[i], pad_after=(0,) * (len(ops[i].sizes) - 1) + (8,))
    return g, dataclasses.replace(r, sequence=dataclasses.replace(r.sequence, ops=tuple(ops)))


def test_a_stage_the_printer_refuses_fails_the_build_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(dispatch.LOWERINGS, "test.gemm_relu", _lower_padded)
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    with pytest.raises(BuildError, match=r"stage 1 \(relu\) breaks .*padding"):
        build_design(_example(), NPU4, find_toolchain(), tmp_path / "s")
    assert not any((tmp_path / "s").iterdir())                 # nothing installed


def test_kernels_build_cli_builds_a_staged_catalog_design(tmp_path, monkeypatch, capsys):
    """gemm_bias lowers to GEMM + epilogue: built as a staged artifact, or (today, its
    epilogue zero-padding on the shim DMA) refused naming that stage."""
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    ex = catalog.example("gemm_bias", "64x64x64")
    assert launch_abi.is_staged(launch_abi.lower_example(ex, NPU4))
    rc = main(["kernels", "build", "--design", "gemm_bias", "--shape", "64x64x64",
               "--artifact-dir", str(tmp_path / "s"), "--json"])
    out = json.loads(capsys.readouterr().out)
    if out["built"]:
        m = json.loads((tmp_path / "s" / ex.design.artifact_key() / "manifest.json").read_text())
        assert rc == 0 and m["flow"] == "staged" and len(m["launch"]["stages"]) == 2
    else:
        assert rc == 1 and "stage 1 (epilogue)" in out["failed"][0]["error"]


# --- a decoder-layer stage: the KV write position in a per-launch stream, the cache resident -----
QK_ARGS = ("T_qkv", "q_norm", "k_norm", "cs", "T_q", "k_cache", "v_cache")


@dataclasses.dataclass(frozen=True)
class QkRope(Design):
    """The decode layer's qk_rope stage alone (qwen3-0.6b shapes, KV capacity 32): q/k RMSNorm
    + RoPE at position pos, k and v rows written into the caches at pos (BD addresses in its
    stream). The whole layer cannot be built yet (its GEMV and attention stages zero-pad on the
    shim DMA, which the printer refuses); this stage prints."""

    layer: object = None
    kind: str = "test.qk_rope"

    @property
    def name(self) -> str:
        return "test.qk_rope"


def _lower_qk(d, gen, pos=0, n=None, **_):
    from torch_xdna.kernels.lower.llm_layer import layer_programs
    p = layer_programs(d.layer, gen, pos=pos, n=n)[2]
    return (dispatch.rename_args(p, {}, {"launch_args": QK_ARGS, "scratch_args": ()}),)


def test_llm_stage_writes_the_resident_kv_cache_at_each_launch_position(tmp_path, monkeypatch):
    from torch_xdna.engine.llm.decoder import PrecisionPolicy, step_designs
    from torch_xdna.engine.llm.estimate import resolve_spec
    from torch_xdna.runtime.sim.txn_level import TxnRunner
    monkeypatch.setitem(dispatch.LOWERINGS, "test.qk_rope", _lower_qk)
    spec = resolve_spec("qwen3-0.6b")[1]
    layer = next(d for role, _, d in step_designs(spec, PrecisionPolicy.parse("bf16"), 1, 32, True)
                 if role == "layer")
    d = QkRope(layer=layer)
    types = [a.type for a in _lower_qk(d, NPU4)[0].sequence.args]
    specs = [(tuple(t.shape), torch.bfloat16) for t in types]
    ex = catalog.Example(d, tuple(specs[:4]), tuple(specs[4:]))
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    build_design(ex, NPU4, find_toolchain(), tmp_path / "store")
    m = json.loads((tmp_path / "store" / d.artifact_key() / "manifest.json").read_text())
    assert m["flow"] == "staged" and m["launch"]["stages"][0]["stream"] == "host"
    release_devices()
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
    monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(tmp_path / "store"))
    dev = open_xrt_device(True)
    g = torch.Generator().manual_seed(4)
    host = [torch.randn(s, generator=g).to(dt) for s, dt in specs]
    ins = [dev.upload(t) for t in host[:4]]
    outs = [dev.upload(t) for t in host[4:]]                  # caches resident on the device
    ref = TxnRunner(NPU4)                                     # the simulator's transaction level
    want = [t.clone() for t in host[4:]]
    S, D = 32, spec.head_dim
    try:
        for pos in (3, 4, 17):
            dev.run(Launch(d, ins, outs, {"pos": pos, "n": 1}, op="test"))
            ref.run(d, host[:4], want, {"pos": pos, "n": 1})
            got = [dev.download(o) for o in outs]
            assert all(torch.equal(a, b) for a, b in zip(got, want)), pos
        k0, k = host[5].view(-1, S, D), got[1].view(-1, S, D)
        written = [p for p in range(S) if not torch.equal(k[:, p], k0[:, p])]
        assert written == [3, 4, 17]                          # only the launches' positions
        assert len(dev.kernels._kernels[d.artifact_key()].stages[0].patched) == 3   # 3 streams
    finally:
        release_devices()


# --- a whole decoder layer: built by `kernels build --model`, run on the emulated NPU ----------
def test_tile_aligned_decode_layer_runs_on_the_emulated_npu(tmp_path, monkeypatch):
    """The decode layer of a tile-aligned Qwen3 shape (hidden 64, 4 / 2 heads of 16, KV
    capacity 256 = one key tile, no shim edge padding in any stage) built as a 12-stage
    artifact and run through the xrt backend on the emulated NPU at positions 0, 1, 2 with the
    caches resident: output and both caches bit-identical to the functional level in the
    stages' order with the core kernels' GEMM order (staged_reference,
    TORCH_XDNA_LAYER_ORDER=plan + TORCH_XDNA_GEMM_ORDER=kernel): emulated results."""
    from torch_xdna.engine.llm.designs import model_designs
    from torch_xdna.kernels.stages.llm_layer import staged_reference
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_fixtures import build_model
    model = tmp_path / "tiny-aligned-qwen3"
    build_model("qwen3", model, max_position_embeddings=256, vocab_size=512)
    examples, skipped = model_designs(str(model), "bf16", NPU4)
    ex = next(e for e in examples if e.design.kind == "llm_layer" and e.design.attention.rows == 1)
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    build_design(ex, NPU4, find_toolchain(), tmp_path / "store")
    release_devices()
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "xrt")
    monkeypatch.setenv("TORCH_XDNA_XRT", "emulated")
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(tmp_path / "store"))
    ins, outs = ex.tensors(seed=5)
    ins = [t * 0.1 if t.dim() == 2 and t.dtype == torch.bfloat16 else t for t in ins]
    d = ex.design
    dev = open_xrt_device(True)
    try:
        dins = [dev.upload(t) for t in ins]
        douts = [dev.upload(t) for t in outs]
        want = [t.clone() for t in outs]
        for pos in (0, 1, 2):
            x = torch.randn(1, d.attention.hidden, generator=torch.Generator().manual_seed(pos))
            dins[0] = dev.upload(x)
            dev.run(Launch(d, dins, douts, {"pos": pos, "n": 1}, op="test"))
            with numerics.use_gemm_order("kernel"):
                staged_reference(d, [x, *ins[1:]], want, pos=pos, n=1)
            got = [dev.download(o) for o in douts]
            assert all(torch.equal(a, b) for a, b in zip(got, want)), \
                (pos, [float((a.float() - b.float()).abs().max()) for a, b in zip(got, want)],
                 [float(b.float().abs().max()) for b in want])
        assert torch.isfinite(got[0]).all() and got[0].abs().max() > 0
    finally:
        release_devices()
