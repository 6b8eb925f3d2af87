"""Artifact manifests fail closed: tampered, resized, symlinked, badly owned or permissive files,
missing entries and wrong generations are refused before any hardware context opens."""
from __future__ import annotations

import json
import os

import pytest
import torch

from fake_pyxrt import FakeXrt, make_artifact
from torch_xdna.hw import NPU1, NPU4
from torch_xdna.kernels import GemmDesign
from torch_xdna.kernels.toolchain.artifacts import ArtifactError, ArtifactStore, default_artifact_dir
from torch_xdna.runtime import Launch
from torch_xdna.runtime.xrt.device import XrtDevice
from torch_xdna.runtime.xrt.session import release_devices

DESIGN = GemmDesign(4, 16, 8)


@pytest.fixture
def art(tmp_path):
    """A valid xclbin-flow artifact for DESIGN and the pieces to launch it."""
    release_devices()
    fx = FakeXrt()
    store = ArtifactStore(tmp_path / "art")
    dev = XrtDevice(NPU4, 64 << 20, fx, store)
    a, b = torch.randn(4, 16), torch.randn(16, 8)
    ins, out = [dev.upload(a), dev.upload(b)], dev.empty((4, 8), torch.float32)
    d = make_artifact(tmp_path / "art", fx, DESIGN, NPU4, ins, [out])
    yield d, dev, fx, ins, out, (a, b)
    release_devices()


def refused(dev, fx, ins, out, match):
    with pytest.raises(ArtifactError, match=match) as e:
        dev.run(Launch(DESIGN, ins, [out]))
    assert "hw_context" not in fx.names() and "xclbin" not in fx.names()   # nothing reached XRT
    return str(e.value)


def manifest(d):
    return json.loads((d / "manifest.json").read_text())


def test_valid_artifact_loads_and_runs(art):
    d, dev, fx, ins, out, (a, b) = art
    m = manifest(d)
    assert m["artifact_key"] == DESIGN.artifact_key() and m["generation"] == "npu4"
    assert m["flow"] == "xclbin" and m["kernel"] == "MLIR_AIE" and len(m["xclbin_uuid"]) == 36   # uuid.to_string() form
    assert set(m["files"]) == {"xclbin", "insts"} and m["toolchain"]["name"] == "fake"
    assert [x["role"] for x in m["abi"]] == ["input", "input", "output"]
    loaded = dev.artifacts.lookup(DESIGN.artifact_key(), "npu4")
    assert loaded.insts == (d / "insts.bin").read_bytes()
    dev.run(Launch(DESIGN, ins, [out]))
    ref = a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()
    torch.testing.assert_close(dev.download(out), ref, rtol=1e-5, atol=1e-5)


def test_flipped_byte(art):
    d, dev, fx, ins, out, _ = art
    p = d / "design.xclbin"
    data = bytearray(p.read_bytes())
    data[5] ^= 0x01
    p.write_bytes(bytes(data))
    msg = refused(dev, fx, ins, out, "SHA-256")
    assert "design.xclbin" in msg and "reinstall" in msg


def test_flipped_byte_in_instruction_stream(art):
    d, dev, fx, ins, out, _ = art
    p = d / "insts.bin"
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x80
    p.write_bytes(bytes(data))
    refused(dev, fx, ins, out, "insts.bin: SHA-256")


def test_wrong_size(art):
    d, dev, fx, ins, out, _ = art
    with open(d / "insts.bin", "ab") as f:
        f.write(b"\0\0\0\0")
    refused(dev, fx, ins, out, "manifest says 64")


def test_symlinked_file(art, tmp_path):
    d, dev, fx, ins, out, _ = art
    real = tmp_path / "elsewhere.xclbin"
    (d / "design.xclbin").rename(real)
    (d / "design.xclbin").symlink_to(real)
    msg = refused(dev, fx, ins, out, "symlink")
    assert "cp --remove-destination" in msg


def test_symlinked_manifest_and_directory(art, tmp_path):
    d, dev, fx, ins, out, _ = art
    moved = tmp_path / "moved"
    d.rename(moved)
    d.symlink_to(moved)
    refused(dev, fx, ins, out, "symlink")


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_group_or_other_writable(art, mode):
    d, dev, fx, ins, out, _ = art
    os.chmod(d / "design.xclbin", mode)
    msg = refused(dev, fx, ins, out, "writable")
    assert "chmod go-w" in msg


def test_group_writable_directory(art):
    d, dev, fx, ins, out, _ = art
    os.chmod(d, 0o775)
    refused(dev, fx, ins, out, "writable")


def test_wrong_owner(art):
    d, dev, fx, ins, out, _ = art
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    os.chown(d / "insts.bin", 4242, 4242)
    msg = refused(dev, fx, ins, out, "owned by uid 4242")
    assert "chown" in msg


def test_missing_file(art):
    d, dev, fx, ins, out, _ = art
    (d / "insts.bin").unlink()
    refused(dev, fx, ins, out, "insts.bin: is missing")


def test_missing_manifest_entry(art):
    d, dev, fx, ins, out, _ = art
    m = manifest(d)
    del m["files"]["insts"]
    (d / "manifest.json").write_text(json.dumps(m))
    msg = refused(dev, fx, ins, out, "lists no 'insts' file")
    assert "xclbin, insts" in msg


def test_wrong_generation(art):
    d, dev, fx, ins, out, _ = art
    m = manifest(d)
    m["generation"] = "npu1"
    (d / "manifest.json").write_text(json.dumps(m))
    msg = refused(dev, fx, ins, out, "built for npu1; this NPU is npu4")
    assert "build the design for npu4" in msg


def test_manifest_for_another_design(art):
    d, dev, fx, ins, out, _ = art
    m = manifest(d)
    m["artifact_key"] = GemmDesign(8, 16, 8).artifact_key()
    (d / "manifest.json").write_text(json.dumps(m))
    refused(dev, fx, ins, out, "not this design's")


def test_path_escape_in_manifest(art):
    d, dev, fx, ins, out, _ = art
    m = manifest(d)
    m["files"]["xclbin"]["path"] = "../design.xclbin"
    (d / "manifest.json").write_text(json.dumps(m))
    refused(dev, fx, ins, out, "plain file name")


def test_corrupt_manifest(art):
    d, dev, fx, ins, out, _ = art
    (d / "manifest.json").write_text("{not json")
    refused(dev, fx, ins, out, "not valid JSON")


def test_xclbin_uuid_mismatch_refused_before_context(art):
    d, dev, fx, ins, out, _ = art
    m = manifest(d)
    m["xclbin_uuid"] = "0" * 32
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="UUID"):
        dev.run(Launch(DESIGN, ins, [out]))
    assert "hw_context" not in fx.names()


def test_validation_cached_per_process(art):
    d, dev, fx, ins, out, _ = art
    dev.run(Launch(DESIGN, ins, [out]))
    (d / "insts.bin").write_bytes(b"x" * 64)      # tampering after load is caught on the next lookup
    dev.run(Launch(DESIGN, ins, [out]))           # cached: same process, already validated and loaded
    dev.artifacts.forget()
    dev.kernels.close()
    with pytest.raises(ArtifactError, match="SHA-256"):
        dev.run(Launch(DESIGN, ins, [out]))


def test_artifact_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_XDNA_ARTIFACT_DIR", str(tmp_path / "x"))
    assert default_artifact_dir() == tmp_path / "x"
    assert ArtifactStore().directory == tmp_path / "x"
    monkeypatch.delenv("TORCH_XDNA_ARTIFACT_DIR")
    assert default_artifact_dir().name == "artifacts"


def test_store_for_another_generation(art):
    d, *_ = art
    store = ArtifactStore(d.parent)
    with pytest.raises(ArtifactError, match="this NPU is npu1"):
        store.lookup(DESIGN.artifact_key(), NPU1.name)
