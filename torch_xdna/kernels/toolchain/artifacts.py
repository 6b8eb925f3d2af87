"""Hardware artifacts for designs: writing and installing manifests (the build side).

Validation lives with its consumer, the xrt backend (runtime/xrt/artifacts.py, re-exported here);
this module knows designs, so it derives the manifest's identity (Design.artifact_key()) and
argument ABI from a design and an example launch.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Mapping, Sequence

from torch_xdna.hw import Generation
from torch_xdna.kernels.base import Design
from torch_xdna.runtime.xrt.artifacts import (
    ENV_DIR, FLOWS, MANIFEST, SCHEMA, ArgSpec, Artifact, ArtifactError, ArtifactStore,
    canonical_uuid, default_artifact_dir,
)

__all__ = ["ArgSpec", "Artifact", "ArtifactError", "ArtifactStore", "ENV_DIR", "MANIFEST",
           "abi_for", "default_artifact_dir", "install_artifact", "write_manifest"]

FILE_MODE = 0o644
DIR_MODE = 0o755


def abi_for(inputs: Sequence, outputs: Sequence, scalars: Sequence[tuple[str, str, int]] = (),
            kernel_dtypes: Mapping[int, object] | None = None) -> list[ArgSpec]:
    """The ABI of a launch: inputs then outputs (tensors or TensorArgs), then named scalars
    (name, dtype, instruction-stream word that carries it). `kernel_dtypes` maps an input index to
    the dtype the kernel takes when it differs from the tensor's (e.g. bf16 operands of a float32
    GEMM: the backend rounds them on the host, as the array would)."""
    kd = dict(kernel_dtypes or {})

    def name(dt) -> str:
        return str(dt).removeprefix("torch.")

    def spec(role, i, t):
        dt = kd.get(i, t.dtype) if role == "input" else t.dtype
        return ArgSpec(role, i, dtype=name(dt), shape=tuple(t.shape))
    return ([spec("input", i, t) for i, t in enumerate(inputs)]
            + [spec("output", i, t) for i, t in enumerate(outputs)]
            + [ArgSpec("scalar", name=n, dtype=d, patch=p) for n, d, p in scalars])


def write_manifest(directory: Path, design: Design, gen: Generation, files: Mapping[str, str], *,
                   flow: str, kernel: str, abi: Sequence[ArgSpec], xclbin_uuid: str = "",
                   num_bo_args: int | None = None, toolchain: Mapping | None = None,
                   launch: Mapping | None = None) -> Path:
    """Hash `files` (role -> file name inside `directory`) and write manifest.json beside them
    (`launch`: a staged artifact's buffers and stages, kernels/toolchain/launch_abi.py)."""
    directory = Path(directory)
    if flow not in FLOWS:
        raise ValueError(f"flow must be one of {', '.join(FLOWS)}, not {flow!r}")
    entries = {}
    for role, name in files.items():
        data = (directory / name).read_bytes()
        entries[role] = {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    nbuf = sum(1 for a in abi if a.is_buffer)
    manifest = {
        "schema": SCHEMA,
        "artifact_key": design.artifact_key(),
        "design": design.name,
        "design_key": repr(design.key),
        "generation": gen.name,
        "flow": flow,
        "kernel": kernel,
        "xclbin_uuid": canonical_uuid(xclbin_uuid) or xclbin_uuid if xclbin_uuid else "",
        "num_bo_args": nbuf if num_bo_args is None else num_bo_args,
        "files": entries,
        "abi": [a.to_json() for a in abi],
        "toolchain": dict(toolchain or {}),
    }
    if launch is not None:
        manifest["launch"] = dict(launch)
    path = directory / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.chmod(path, FILE_MODE)
    return path


def install_artifact(root: Path, design: Design, gen: Generation, contents: Mapping[str, tuple[str, bytes]],
                     **manifest_fields) -> Path:
    """Write an artifact (role -> (file name, bytes)) under root/<artifact_key>/ with safe modes."""
    d = Path(root) / design.artifact_key()
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, DIR_MODE)
    for name, data in contents.values():
        p = d / name
        p.write_bytes(data)
        os.chmod(p, FILE_MODE)
    write_manifest(d, design, gen, {role: name for role, (name, _) in contents.items()}, **manifest_fields)
    return d
