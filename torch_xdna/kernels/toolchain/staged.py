"""Building staged artifacts: a design whose launch runs several array programs (or one whose
stream depends on launch values) becomes one xclbin with one kernel per distinct array
configuration, plus the fixed stages' instruction streams and the launch ABI in the manifest.

The xclbin is built as mlir-aie test/npu-xrt/add_one_two does (run.lit @
0711465f43fe51c99abb71de2c6089188e3db623): the first configuration by one aiecc.py call with
`--xclbin-kernel-name=K.. --xclbin-kernel-id=0x901 --xclbin-instance-name=K..INST`, each next one
by a call that adds its kernel to the previous xclbin (`--xclbin-input=<previous>`, kernel id
0x902, ...). Every stage's stream (fixed or per launch) is compared with the one aiecc wrote for
its configuration; fixed streams ship as `insts.<j>`, per-launch ("host") streams are encoded by
the backend at each launch's scalars. The manifest is validated by the backend's own validator
(runtime/xrt/artifacts.py, check_launch) before the atomic install.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from torch_xdna.hw import Generation
from torch_xdna.kernels.toolchain import build as B
from torch_xdna.kernels.toolchain import launch_abi
from torch_xdna.kernels.toolchain.artifacts import ArgSpec, write_manifest
from torch_xdna.kernels.toolchain.catalog import Example

FIRST_KERNEL_ID = 0x901             # add_one_two: ADDONE 0x901, ADDTWO 0x902


def build_design(ex: Example, gen: Generation, toolchain: B.Toolchain, store_root: Path, *,
                 runner: B.Runner = B.run_tool, keep_build: Path | None = None,
                 log: Callable[[str], None] = lambda s: None) -> B.BuildResult:
    """Build and install any design's artifact: staged when it lowers to several programs or
    a per-launch stream, else the one-program xclbin flow (build.build_artifact)."""
    progs = launch_abi.lower_example(ex, gen)
    if not launch_abi.is_staged(progs):
        return B.build_artifact(ex, gen, toolchain, store_root, runner=runner,
                                keep_build=keep_build, log=log)
    return build_staged(ex, progs, gen, toolchain, store_root, runner=runner,
                        keep_build=keep_build, log=log)


def build_staged(ex: Example, progs, gen: Generation, toolchain: B.Toolchain, store_root: Path, *,
                 runner: B.Runner = B.run_tool, keep_build: Path | None = None,
                 log: Callable[[str], None] = lambda s: None) -> B.BuildResult:
    from torch_xdna.array import txn
    design = ex.design
    key = design.artifact_key()
    label = f"{design.name} ({key})"
    try:
        launch = launch_abi.launch_abi(progs, ex.inputs, ex.outputs)
    except ValueError as e:
        raise B.BuildError(f"{label}: {e}") from None
    if launch.get("executable") is False:
        raise B.BuildError(f"{label}: its stage programs are structural only ({launch['why']}); "
                           f"there is nothing the chip could run")
    work = B.new_workdir(store_root, key)
    commands: list[list[str]] = []
    step = B.stepper(work, commands, runner, log, label)
    try:
        objects: set = set()
        built: dict[str, str] = {}          # kernel -> its aiecc stream file
        xclbin, files = "", {}
        for j, (prog, st) in enumerate(zip(progs, launch["stages"])):
            where = f"{label} stage {j} ({st['label']})"
            nbytes = [a.type.nbytes for a in prog.sequence.args]
            scalars = {s.name: 0 for s in prog.sequence.scalars}
            ours = txn.to_bytes(txn.encode_sequence(prog, txn.LaunchBinding.of(nbytes, **scalars)))
            (work / f"insts.{j}").write_bytes(ours)
            if st["kernel"] not in built:
                mlir = f"design.{j}.mlir"
                (work / mlir).write_text(B.printable(prog, gen, where))
                B.compile_kernels(prog, gen, toolchain, work, step, objects)
                out = f"stage{len(built)}.xclbin"
                kid = f"0x{FIRST_KERNEL_ID + len(built):x}"
                extra = [f"--xclbin-kernel-name={st['kernel']}", f"--xclbin-kernel-id={kid}",
                         f"--xclbin-instance-name={st['kernel']}INST"]
                if xclbin:
                    extra.append(f"--xclbin-input={xclbin}")
                step(B.aiecc_argv(toolchain, mlir, out, f"insts.{j}.aiecc", *extra),
                     f"aiecc.py stage {j} ({st['kernel']})")
                if not (work / out).is_file():
                    raise B.BuildError(f"aiecc.py reported success but wrote no {out} for {where}")
                patches = B.scalar_patches(prog, nbytes, txn.encode_sequence)
                B.check_aiecc_stream(work, f"insts.{j}.aiecc", ours, patches.values(), where)
                built[st["kernel"]], xclbin = f"insts.{j}.aiecc", out
            if st["stream"] == "fixed":
                files[st["insts"]] = f"insts.{j}"
            else:
                os.unlink(work / f"insts.{j}")      # encoded per launch by the backend
        os.replace(work / xclbin, work / "design.xclbin")
        files["xclbin"] = "design.xclbin"
        uid = B.xclbin_uuid((work / "design.xclbin").read_bytes())
        for p in list(work.iterdir()):          # intermediate xclbins and aiecc's streams
            if p.name.endswith((".aiecc",)) or (p.name.startswith("stage") and p.suffix == ".xclbin"):
                p.unlink()
        abi = [ArgSpec(b["role"], b["index"], dtype=b.get("kernel_dtype", b["dtype"]),
                       shape=tuple(b["shape"])) for b in launch["buffers"] if b["role"] != "scratch"]
        tc = dict(toolchain.versions, stream_matches_aiecc=True, xclbin_kernels=len(built))
        write_manifest(work, design, gen, files, flow="staged", kernel=launch["stages"][0]["kernel"],
                       abi=abi, xclbin_uuid=uid, toolchain=tc, launch=launch)
        final = B.install_checked(work, store_root, key, gen, design.name, keep_build)
        return B.BuildResult(key, final, uid, files, tc, commands, True)
    except BaseException:
        B.discard(work, keep_build)
        raise
