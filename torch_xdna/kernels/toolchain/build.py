"""Building hardware artifacts for designs: design -> array program -> MLIR-AIE + core kernels ->
the AIE toolchain -> xclbin + instruction stream -> a validated artifact in the store.

The toolchain (mlir-aie's aiecc.py, Peano's clang++ for aie2p, XRT's xclbinutil) runs on the
user's machine; none of it installs from the package registries. Everything up to calling it is
ours and tested (tests/test_kernels_build.py runs a fake toolchain that records its argv). A build
happens in a private temporary directory next to the store and is renamed into place only when
every step succeeded and the manifest validates: the store never holds a partial artifact.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from torch_xdna.hw import Generation, host
from torch_xdna.kernels.toolchain.artifacts import ArtifactStore, abi_for, write_manifest
from torch_xdna.kernels.toolchain.catalog import Example
from torch_xdna.kernels.toolchain.launch_abi import DTYPES_IR_TO_TORCH

ENV_PEANO = "PEANO_INSTALL_DIR"
ENV_MLIR_AIE = "MLIR_AIE_INSTALL_DIR"
PEANO_TARGET = {"aie2p": "aie2p-none-unknown-elf", "aie2": "aie2-none-unknown-elf"}
PEANO_FLAGS = ("-O2", "-std=c++20", "-Wno-parentheses", "-Wno-attributes", "-Wno-macro-redefined",
               "-DNDEBUG")            # mlir-aie programming_examples/makefile-common (PEANOWRAP2P_FLAGS)

INSTALL_HELP = """\
The AIE toolchain is not installed (it does not come from PyPI's torch-xdna dependencies). On the
Ryzen AI machine, following mlir-aie's README ("Getting Started for AMD Ryzen AI on Linux"):

  python3 -m pip install mlir_aie -f https://github.com/Xilinx/mlir-aie/releases/expanded_assets/latest-wheels-2
  python3 -m pip install llvm-aie -f https://github.com/Xilinx/llvm-aie/releases/expanded_assets/nightly
  export PEANO_INSTALL_DIR="$(python3 -m pip show llvm-aie | awk '/^Location/{print $2}')/llvm-aie"
  source /opt/xilinx/xrt/setup.sh        # puts XRT's xclbinutil on PATH

then run this command again (`xdna kernels build --check` only checks the toolchain)."""


class BuildError(ValueError):
    """A build step failed or a design cannot be built; nothing was installed."""


class ToolchainMissing(BuildError):
    def __init__(self, missing: Sequence[str]):
        self.missing = list(missing)
        super().__init__("xdna kernels build: missing " + "; ".join(self.missing) + "\n" + INSTALL_HELP)


Runner = Callable[[Sequence[str], Path], tuple[int, str, str]]


def run_tool(argv: Sequence[str], cwd: Path) -> tuple[int, str, str]:
    try:
        p = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, "", str(e)
    return p.returncode, p.stdout, p.stderr


@dataclass(frozen=True)
class Toolchain:
    """Where each tool is, and the version each reports (recorded in the manifest)."""

    aiecc: str
    peano_cxx: str
    aie_include: str | None
    xclbinutil: str | None
    versions: dict = field(default_factory=dict)


def find_toolchain(env=None, which: Callable = shutil.which, runner: Runner = run_tool) -> Toolchain:
    """The toolchain from PATH and PEANO_INSTALL_DIR, or ToolchainMissing naming each gap."""
    env = os.environ if env is None else env  # settings-ok: a mapping tests replace
    path = env.get("PATH", "")
    missing = []
    aiecc = which("aiecc.py", path=path) or which("aiecc", path=path)
    if not aiecc:
        missing.append("aiecc.py (mlir-aie) on PATH")
    peano_dir = env.get(ENV_PEANO, "")
    peano = str(Path(peano_dir) / "bin" / "clang++") if peano_dir else ""
    if not peano or not Path(peano).is_file():
        missing.append(f"Peano's clang++ ({ENV_PEANO}={peano_dir or '<unset>'}: no bin/clang++)")
    xclbinutil = which("xclbinutil", path=path)
    if missing:
        raise ToolchainMissing(missing)
    include = None
    mlir_dir = env.get(ENV_MLIR_AIE) or str(Path(aiecc).resolve().parent.parent)
    if (Path(mlir_dir) / "include" / "aie_api").is_dir():
        include = str(Path(mlir_dir) / "include")
    versions = {}
    for name, tool in (("aiecc", aiecc), ("peano", peano), ("xclbinutil", xclbinutil)):
        if tool:
            rc, out, err = runner([tool, "--version"], Path.cwd())
            first = (out or err).strip().splitlines()
            versions[name] = first[0][:120] if rc == 0 and first else "unknown"
    return Toolchain(aiecc, peano, include, xclbinutil, versions)


# --- pieces of a build ----------------------------------------------------------------------------
def xclbin_uuid(data: bytes) -> str:
    """The xclbin's UUID as XRT's uuid.to_string() prints it, read from the axlf header."""
    magic = host.XCLBIN_MAGIC.value
    off = host.XCLBIN_UUID_OFFSET.value
    if data[:len(magic)] != magic or len(data) < off + 16:
        raise BuildError("the toolchain's xclbin has no axlf header (magic 'xclbin2'); the build "
                         "is broken or the file is not an xclbin")
    return str(uuidlib.UUID(bytes=data[off:off + 16]))


def kernel_objects(program, arch: str, gen_dir: Path | None = None) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """object file -> (core-kernel source, -D defines) for every kernel a program declares.

    Refuses (BuildError) a declaration whose argument list disagrees with the C++ signature in
    the kernel table (count, pointer or scalar, element type), object files not named per
    source and defines (kernels/aie.object_files), which would link a symbol twice into a core,
    and tiles a source's static_asserts reject (kernels/aie.TILE_RULES). Generated kernels
    (fused chains, kernels/aie/chain_gen.py) are written to `gen_dir` (the build directory)."""
    from torch_xdna.kernels import aie
    chain = dict(program.notes).get("chain")
    generated = {}
    try:
        for decl in program.kernels:
            aie.check_decl(decl.symbol, decl.arg_types, chain)
            g = aie.generated(decl.symbol, decl.arg_types, chain)
            if g:
                generated[decl.symbol] = g[0]
        objs = aie.object_files(program.kernels, chain)
    except aie.KernelContractError as e:
        raise BuildError(f"{program.name}: {e}") from None
    out: dict[str, tuple[Path, tuple[str, ...]]] = {}
    for decl in program.kernels:
        obj, source, defs = objs[decl.symbol]
        if decl.object_file != obj:
            raise BuildError(f"{program.name}: core kernel {decl.symbol} declares object "
                             f"{decl.object_file!r}; objects are one per source and defines "
                             f"({obj!r}), so a core linking several symbols of {source} gets "
                             f"each once")
        bad = aie.tile_errors(source, defs)
        if bad:
            raise BuildError(f"{program.name}: core kernel {decl.symbol}: {source} does not "
                             f"compile for this design's tiles: needs {'; '.join(bad)} "
                             f"(static_assert in the source; the plan chose the tile)")
        if decl.symbol in generated:
            if gen_dir is None:
                raise BuildError(f"{program.name}: core kernel {decl.symbol} is generated at build "
                                 "time and needs a build directory (gen_dir)")
            src = Path(gen_dir) / source
            src.write_text(generated[decl.symbol])
        else:
            src = Path(aie.__file__).resolve().parent / arch / source
        out[obj] = (src, tuple(f"-D{k}={v}" for k, v in defs))
    return out


def scalar_patches(program, binding_bytes: Sequence[int], encode) -> dict[str, int]:
    """The stream word that carries each launch scalar: encode with two values and compare."""
    from torch_xdna.array import txn
    names = [s.name for s in program.sequence.scalars]
    if not names:
        return {}
    a = encode(program, txn.LaunchBinding.of(binding_bytes, **{n: 1 for n in names}))
    out = {}
    for n in names:
        b = encode(program, txn.LaunchBinding.of(binding_bytes, **{m: (2 if m == n else 1)
                                                                    for m in names}))
        diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        if len(diff) != 1:
            raise BuildError(f"{program.name}: launch scalar {n!r} is not carried by exactly one "
                             f"stream word ({len(diff)} differ); it cannot be patched per launch")
        out[n] = diff[0]
    return out


@dataclass
class BuildResult:
    key: str
    directory: Path
    uuid: str
    files: dict
    toolchain: dict
    commands: list
    stream_matches_aiecc: bool | None


def build_artifact(ex: Example, gen: Generation, toolchain: Toolchain, store_root: Path, *,
                   runner: Runner = run_tool, keep_build: Path | None = None,
                   log: Callable[[str], None] = lambda s: None) -> BuildResult:
    """Build and install the artifact of one design (one array program); atomic."""
    from torch_xdna.array import mlir as aie_mlir
    from torch_xdna.array import txn
    from torch_xdna.kernels.lower import lower

    design = ex.design
    key = design.artifact_key()
    progs = lower(design, gen)
    if len(progs) != 1:
        raise BuildError(f"{design.name} ({key}) lowers to {len(progs)} array programs; an artifact "
                         f"holds one xclbin and one stream, so multi-stage designs are not buildable "
                         f"yet")
    program = progs[0]
    args = program.sequence.args
    if len(args) != len(ex.inputs) + len(ex.outputs):
        raise BuildError(f"{design.name}: its array program takes {len(args)} host buffers, the "
                         f"launch has {len(ex.inputs)} inputs + {len(ex.outputs)} outputs")
    store_root = Path(store_root)
    store_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=store_root))
    commands: list[list[str]] = []

    def step(argv: list[str], what: str) -> None:
        commands.append(argv)
        log(f"  {what}: {' '.join(argv)}")
        rc, out, err = runner(argv, work)
        if rc != 0:
            tail = "\n".join((err or out).strip().splitlines()[-15:])
            raise BuildError(f"{what} failed (exit {rc}) for {design.name} ({key}):\n{tail}\n"
                             f"nothing was installed; rerun with --keep-build DIR to inspect the "
                             f"build directory")

    try:
        (work / "design.mlir").write_text(aie_mlir.to_mlir(program, gen.arch))
        kdir = Path(__file__).resolve().parent.parent / "aie" / gen.arch
        for obj, (src, defines) in kernel_objects(program, gen.arch, gen_dir=work).items():
            argv = [toolchain.peano_cxx, *PEANO_FLAGS, f"--target={PEANO_TARGET[gen.arch]}",
                    *defines, f"-I{kdir}"]
            if toolchain.aie_include:
                argv.append(f"-I{toolchain.aie_include}")
            step(argv + ["-c", str(src), "-o", obj], f"compile {src.name} -> {obj}")
        step([toolchain.aiecc, "--aie-generate-xclbin", "--aie-generate-npu-insts",
              "--no-compile-host", "--no-xchesscc", "--no-xbridge",
              f"--peano={Path(toolchain.peano_cxx).parent.parent}", "--xclbin-name=final.xclbin",
              "--npu-insts-name=insts.aiecc.bin", "design.mlir"], "aiecc.py")
        xclbin = work / "final.xclbin"
        if not xclbin.is_file():
            raise BuildError(f"aiecc.py reported success but wrote no final.xclbin in {work}")
        uid = xclbin_uuid(xclbin.read_bytes())
        # the stream the backend submits: our encoder's, bound to this launch's buffer sizes;
        # aiecc's own is kept beside it and compared (a mismatch is reported, not hidden)
        nbytes = [a.type.nbytes for a in args]
        scalars = {s.name: 0 for s in program.sequence.scalars}
        words = txn.encode_sequence(program, txn.LaunchBinding.of(nbytes, **scalars))
        (work / "insts.bin").write_bytes(txn.to_bytes(words))
        theirs = work / "insts.aiecc.bin"
        matches = theirs.read_bytes() == (work / "insts.bin").read_bytes() if theirs.is_file() else None
        patches = scalar_patches(program, nbytes, txn.encode_sequence)
        kernel_dtypes = {i: DTYPES_IR_TO_TORCH[a.type.dtype] for i, a in enumerate(args[:len(ex.inputs)])
                         if DTYPES_IR_TO_TORCH.get(a.type.dtype) != _dtype_name(ex.inputs[i][1])}
        abi = abi_for([_Spec(*s) for s in ex.inputs], [_Spec(*s) for s in ex.outputs],
                      [(s.name, "float32" if s.dtype == "f32" else "int32", patches[s.name])
                       for s in program.sequence.scalars], kernel_dtypes)
        files = {"xclbin": "final.xclbin", "insts": "insts.bin"}
        tc = dict(toolchain.versions, stream_matches_aiecc=matches)
        write_manifest(work, design, gen, files, flow="xclbin", kernel="MLIR_AIE", abi=abi,
                       xclbin_uuid=uid, toolchain=tc)
        for p in work.iterdir():
            if p.is_file():
                os.chmod(p, 0o644)
        os.chmod(work, 0o755)
        _validate_in_place(work, key, gen, design.name)    # exactly as the backend will
        if keep_build is not None:
            shutil.copytree(work, keep_build, dirs_exist_ok=True)
        final = store_root / key
        _install(work, final)
        return BuildResult(key, final, uid, files, tc, commands, matches)
    except BaseException:
        if work.exists():
            if keep_build is not None:
                shutil.copytree(work, keep_build, dirs_exist_ok=True)
            shutil.rmtree(work, ignore_errors=True)
        raise


def _dtype_name(dt) -> str:
    return str(dt).removeprefix("torch.")


@dataclass(frozen=True)
class _Spec:
    """A (shape, dtype) stand-in with the attributes abi_for reads."""

    shape: tuple
    dtype: object


def _validate_in_place(work: Path, key: str, gen: Generation, design: str) -> None:
    """Run the backend's fail-closed validation on the build directory as if it were installed."""
    tmp_root = Path(tempfile.mkdtemp(prefix=".validate-", dir=work.parent))
    try:
        os.chmod(tmp_root, 0o755)
        os.rename(work, tmp_root / key)
        try:
            ArtifactStore(tmp_root).validate(key, gen.name, design)
        finally:
            os.rename(tmp_root / key, work)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)


def _install(work: Path, final: Path) -> None:
    """Atomically replace `final` by `work` (same filesystem)."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
    try:
        os.rename(work, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
