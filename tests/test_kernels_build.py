"""`xdna kernels build` and `xdna selftest` against a fake AIE toolchain and the fake pyxrt: the
argv each tool gets, the artifact and manifest written (accepted by the xrt backend, tampering
refused), atomic installs, and clear exits without the toolchain or the NPU."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fake_toolchain
from fake_host import healthy_strix
from fake_pyxrt import FakeXrt, make_artifact, reference_compute
from torch_xdna.cli.main import main
from torch_xdna.hw import NPU4
from torch_xdna.kernels.toolchain import catalog
from torch_xdna.runtime import Launch
from torch_xdna.runtime.sim import SimDevice
from torch_xdna.runtime.xrt.artifacts import ArtifactError, ArtifactStore
from torch_xdna.runtime.xrt.device import XrtDevice
from torch_xdna.runtime.xrt.session import release_devices

BUDGET = 64 << 20
GEMM = ["--design", "gemm", "--shape", "64x64x64"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    release_devices()
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(tmp_path / "store"))
    yield
    release_devices()


def test_without_toolchain_exit_2_and_nothing_installed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("PEANO_INSTALL_DIR", raising=False)
    assert main(["kernels", "build", *GEMM]) == 2
    err = capsys.readouterr().err
    assert "aiecc.py" in err and "pip install mlir_aie" in err and "PEANO_INSTALL_DIR" in err
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())
    assert main(["kernels", "build", "--check"]) == 2


def test_check_reports_versions(tmp_path, monkeypatch, capsys):
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    assert main(["kernels", "build", "--check", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["aiecc"] == "aiecc.py fake 1.2.3" and "llvm-aie" in v["peano"]


def built_gemm(tmp_path, monkeypatch, capsys):
    log = fake_toolchain.install(tmp_path / "tc", monkeypatch)
    assert main(["kernels", "build", *GEMM, "--json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    return log, out


def test_build_writes_an_artifact_the_backend_accepts(tmp_path, monkeypatch, capsys):
    log, out = built_gemm(tmp_path, monkeypatch, capsys)
    (b,) = out["built"]
    ex = catalog.example("gemm", "64x64x64")
    assert b["key"] == ex.design.artifact_key() and len(b["xclbin_uuid"]) == 36
    argv = fake_toolchain.calls(log)
    clang = [a for a in argv if a[0] == "clang++" and "-c" in a]
    assert clang and all("--target=aie2p-none-unknown-elf" in a for a in clang)
    assert any(a[-1] == "matmul_bf16_f32.o" or "-DDIM_M=" in " ".join(a) for a in clang)
    aiecc = next(a for a in argv if a[0] == "aiecc.py" and "design.mlir" in a)
    assert "--aie-generate-xclbin" in aiecc and "--no-xchesscc" in aiecc
    m = json.loads((tmp_path / "store" / b["key"] / "manifest.json").read_text())
    assert m["toolchain"]["aiecc"] == "aiecc.py fake 1.2.3" and m["generation"] == "npu4"
    assert [a["dtype"] for a in m["abi"]] == ["bfloat16", "bfloat16", "float32"]
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".")]

    # the xrt backend (fake pyxrt) loads it and computes what the simulator computes
    fx = FakeXrt()
    store = ArtifactStore(tmp_path / "store")
    dev = XrtDevice(NPU4, BUDGET, fx, store)
    art = store.lookup(b["key"], "npu4")
    fx.computes[b["key"]] = reference_compute(ex.design, art.abi)
    ins, outs = ex.tensors(seed=3)
    a_in = [dev.upload(t) for t in ins]
    o = dev.empty((64, 64), torch.float32)
    dev.run(Launch(ex.design, a_in, [o]))
    sim = SimDevice(NPU4, BUDGET)
    so = sim.empty((64, 64), torch.float32)
    sim.run(Launch(ex.design, [sim.upload(t) for t in ins], [so]))
    assert torch.equal(dev.download(o), sim.download(so))


def test_tampered_artifact_refused(tmp_path, monkeypatch, capsys):
    _, out = built_gemm(tmp_path, monkeypatch, capsys)
    d = tmp_path / "store" / out["built"][0]["key"]
    data = bytearray((d / "insts.bin").read_bytes())
    data[-1] ^= 1
    (d / "insts.bin").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="SHA-256"):
        ArtifactStore(tmp_path / "store").validate(d.name, "npu4")


def test_failed_toolchain_step_installs_nothing(tmp_path, monkeypatch, capsys):
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    monkeypatch.setenv("FAKE_AIECC_FAIL", "1")
    assert main(["kernels", "build", *GEMM, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["built"] == [] and "failed to allocate" in out["failed"][0]["error"]
    assert list((tmp_path / "store").iterdir()) == []          # no partial store, no temp dirs


def test_aiecc_stream_differing_from_ours_is_refused(tmp_path, monkeypatch, capsys):
    """aiecc's instruction stream differs from ours in one word: the artifact is refused,
    naming the word, and nothing is installed."""
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    monkeypatch.setenv("FAKE_AIECC_FLIP_WORD", "7")
    assert main(["kernels", "build", *GEMM, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    err = out["failed"][0]["error"]
    assert "aiecc's instruction stream differs" in err and "first differing word 7" in err
    assert list((tmp_path / "store").iterdir()) == []


def test_stream_difference_ignores_only_per_launch_patch_words():
    from torch_xdna.kernels.toolchain.build import stream_difference
    ours = b"".join(i.to_bytes(4, "little") for i in range(10))
    theirs = bytearray(ours)
    theirs[4 * 3] ^= 0xFF
    assert stream_difference(ours, bytes(theirs), patch_words=[3]) is None
    assert "first differing word 3" in stream_difference(ours, bytes(theirs), patch_words=[4])
    assert "bytes" in stream_difference(ours, ours[:-4], patch_words=[])


def test_old_mlir_aie_is_refused_with_the_version(tmp_path, monkeypatch, capsys):
    fake_toolchain.install(tmp_path / "tc", monkeypatch, mlir_aie_version="0.0.1.2025060100+abc1234")
    assert main(["kernels", "build", *GEMM, "--json"]) == 2
    err = capsys.readouterr().err
    assert "0.0.1.2025060100" in err and "0.0.1.2026030400" in err and "PR #2922" in err
    assert not (tmp_path / "store").exists() or list((tmp_path / "store").iterdir()) == []


def test_mlir_aie_without_metadata_is_refused(tmp_path, monkeypatch, capsys):
    fake_toolchain.install(tmp_path / "tc", monkeypatch, mlir_aie_version=None)
    assert main(["kernels", "build", "--check"]) == 2
    assert "no installed mlir_aie package found" in capsys.readouterr().err


def test_aie_api_headers_and_version_from_the_mlir_aie_package_layout(tmp_path, monkeypatch):
    """Headers and version come from an installed mlir_aie wheel's layout: via aiecc.py's place
    (mlir_aie/bin) or MLIR_AIE_INSTALL_DIR, and tag-form versions are ordered too."""
    from torch_xdna.kernels.toolchain.build import find_toolchain, mlir_aie_version_problem
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    import os
    tc = find_toolchain()
    root = tmp_path / "tc" / "site" / "mlir_aie"
    assert tc.aie_include == str(root / "include")
    assert tc.versions["mlir_aie"] == fake_toolchain.MLIR_AIE_VERSION
    other = fake_toolchain.fake_mlir_aie(tmp_path / "other", "1.3.2.dev140+g1234567")
    tc = find_toolchain(env=dict(os.environ, MLIR_AIE_INSTALL_DIR=str(other)))
    assert tc.aie_include == str(other / "include") and tc.versions["mlir_aie"].startswith("1.3.2.dev140")
    assert mlir_aie_version_problem("1.3.2.dev100") and mlir_aie_version_problem("1.0.0")
    assert mlir_aie_version_problem("1.3.2") is None and mlir_aie_version_problem("0.0.1.2026033104+e4f35d6") is None


def test_rebuild_replaces_atomically(tmp_path, monkeypatch, capsys):
    _, first = built_gemm(tmp_path, monkeypatch, capsys)
    assert main(["kernels", "build", *GEMM, "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["built"][0]["key"] == second["built"][0]["key"]
    assert [p.name for p in (tmp_path / "store").iterdir()] == [first["built"][0]["key"]]


def test_dry_run_needs_no_toolchain(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["kernels", "build", *GEMM, "--dry-run", "--out", str(tmp_path / "out"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (d,) = out["written"]
    from pathlib import Path
    files = {p.name for p in Path(d).iterdir()}
    assert {"design.mlir", "design.insts.bin", "mm.cc"} <= files
    assert "aie.device" in (Path(d) / "design.mlir").read_text()


def test_qwen3_0_6b_designs_all_have_an_upstream_form(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["kernels", "build", "--all-for", "qwen3-0.6b", "--dry-run", "--out",
                 str(tmp_path / "out"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # every launch the engine makes is a staged artifact with an mlir-aie form: the embedding,
    # layer and head of each prefill rows bucket (1, 2, ..., 128) and of decode, none skipped
    assert len(out["written"]) == 3 * 8 and not out["skipped"], out["skipped"]
    assert {w.split("/")[-1].split("-")[0] for w in out["written"]} == {"llm_embed", "llm_layer",
                                                                       "llm_head"}


def test_unknown_design_is_a_clear_error(capsys):
    assert main(["kernels", "build", "--design", "nope", "--shape", "8"]) == 2
    assert "unknown design 'nope'" in capsys.readouterr().err
    assert main(["kernels", "build", "--design", "gemm", "--shape", "8x0"]) == 2
    assert main(["kernels", "build", "--design", "gemm"]) == 2


# --- xdna selftest ------------------------------------------------------------------------------
def test_selftest_here_is_hardware_unavailable(capsys):
    assert main(["selftest"]) == 2
    assert "hardware unavailable" in capsys.readouterr().err


def _selftest_store(tmp_path, fx):
    store = tmp_path / "art"
    for name, shape in (("add_one", "1024"), ("gemm", "64x64x64")):
        ex = catalog.example(name, shape)
        ins, outs = ex.tensors()
        make_artifact(store, fx, ex.design, NPU4, ins, outs)
    return ArtifactStore(store)


def test_selftest_on_a_fake_npu_prints_a_receipt(tmp_path, capsys):
    import argparse
    from torch_xdna.cli.npu import selftest
    h = healthy_strix(tmp_path / "root")
    fx = FakeXrt()
    store = _selftest_store(tmp_path, fx)
    receipt = tmp_path / "receipt.json"
    args = argparse.Namespace(json=False, receipt=receipt)
    assert selftest.run(args, system=h.system(), pyxrt=fx, artifacts=store) == 0
    text = capsys.readouterr().out
    assert text.count("bit-exact") == 2 and "selftest passed" in text
    r = json.loads(receipt.read_text())
    assert r["ok"] and [c["design"] for c in r["checks"]] == ["add_one", "gemm"]
    assert all(c["bit_exact"] and c["max_abs_diff"] == 0.0 for c in r["checks"])


def test_selftest_reports_a_mismatch(tmp_path, capsys):
    import argparse
    from torch_xdna.cli.npu import selftest
    h = healthy_strix(tmp_path / "root")
    fx = FakeXrt()
    store = _selftest_store(tmp_path, fx)
    key = catalog.example("gemm", "64x64x64").design.artifact_key()
    real = fx.computes[key]

    def off_by_one_ulp(args, instr):
        real(args, instr)
        out = args[-1].device_tensor().view(torch.int32)
        out[0] += 1
    fx.computes[key] = off_by_one_ulp
    rc = selftest.run(argparse.Namespace(json=True, receipt=None), system=h.system(), pyxrt=fx,
                      artifacts=store)
    r = json.loads(capsys.readouterr().out)
    assert rc == 1 and not r["ok"] and r["checks"][1]["bit_exact"] is False


def test_selftest_without_artifacts_is_unavailable(tmp_path, capsys):
    import argparse
    from torch_xdna.cli.npu import selftest
    h = healthy_strix(tmp_path / "root")
    rc = selftest.run(argparse.Namespace(json=False, receipt=None), system=h.system(),
                      pyxrt=FakeXrt(), artifacts=ArtifactStore(tmp_path / "none"))
    assert rc == 2 and "xdna kernels build" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_aligned_qwen3(tmp_path_factory):
    """A tiny random Qwen3 whose shapes fill whole tiles: KV capacity 256 (one key tile of its
    head_dim-16 attention plan), vocab 512 (whole lm_head column tiles), hidden 64."""
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp("llm") / "tiny-aligned-qwen3"
    build_model("qwen3", path, max_position_embeddings=256, vocab_size=512)
    return path


def test_tile_aligned_decoder_builds_its_layers(tiny_aligned_qwen3, tmp_path, monkeypatch, capsys):
    """Every stage of the decode and prefill layers prints (no shim edge padding: the attention
    stage's Q / output move whole through item-layout scratch, the key tile holding kv_len is
    read whole, vector units divide the row) and builds as a staged artifact through the (fake)
    toolchain; each manifest passes the backend's validator before install."""
    fake_toolchain.install(tmp_path / "tc", monkeypatch)
    assert main(["kernels", "build", "--model", str(tiny_aligned_qwen3), "--artifact-dir",
                 str(tmp_path / "store"), "--json"]) in (0, 1), capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    built = [b["design"] for b in out["built"]]
    # one design per prefill rows bucket (1, 2, 4, ..., 128) and decode: 8 of each
    assert sum("llm.layer" in b for b in built) == 8, out
    assert sum("llm.embed" in b for b in built) == 8, out
    assert sum("llm.head" in b for b in built) == 8, out
    assert not out["skipped"] and not out["failed"], (out["skipped"], out["failed"])
    for b in (b for b in out["built"] if "llm.layer" in b["design"]):
        m = json.loads((tmp_path / "store" / b["key"] / "manifest.json").read_text())
        assert m["flow"] == "staged" and len(m["launch"]["stages"]) == 12
