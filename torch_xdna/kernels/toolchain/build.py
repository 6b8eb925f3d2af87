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

# The oldest mlir-aie whose dialects hold everything array/mlir.py prints: `aie.runtime_sequence`
# (Xilinx/mlir-aie PR #2708, "Promote runtime_sequence to aie dialect", 2025-11) and `link_with`
# on func.func declarations (PR #2922, "func level link_with", opened 2026-03-04). Date-stamped
# wheels are 0.0.1.<YYYYMMDDHH>+<hash> (utils/mlir_aie_wheels/setup.py @ a0b2a0b65ac3ff9d3ee0375e5f5391b33ac0b2d8):
# we require 0.0.1.2026030400 or later, the first wheel date that can hold PR #2922 (its exact
# merge date was not seen, so a wheel of early March 2026 may still lack it: aiecc then fails on
# the link_with attribute, loudly). Tag-based versions (utils/mlir_aie_wheels/_version_helper.py
# @ 32f0eed37ac6429be0258a96824839c0c6242fbc) must be 1.3.2.dev101 or later, the earliest
# tag-based version seen after PR #2922 (mlir-air PR #1670, 2026-06-05); older tag versions
# are refused as unverified.
MLIR_AIE_MIN_DATED = (0, 0, 1, 2026030400)
MLIR_AIE_MIN_TAGGED = (1, 3, 2, -1, 101)            # 1.3.2.dev101
MLIR_AIE_MIN_TEXT = "0.0.1.2026030400 (date-stamped wheel) or 1.3.2.dev101"

INSTALL_HELP = """\
The AIE toolchain is not installed (it does not come from PyPI's torch-xdna dependencies). On the
Ryzen AI machine, following mlir-aie's README ("Getting Started for AMD Ryzen AI on Linux"):

  python3 -m pip install mlir_aie -f https://github.com/Xilinx/mlir-aie/releases/expanded_assets/latest-wheels-2
  python3 -m pip install llvm-aie -f https://github.com/Xilinx/llvm-aie/releases/expanded_assets/nightly
  export MLIR_AIE_INSTALL_DIR="$(python3 -m pip show mlir_aie | awk '/^Location/{print $2}')/mlir_aie"
  export PEANO_INSTALL_DIR="$(python3 -m pip show llvm-aie | awk '/^Location/{print $2}')/llvm-aie"
  export PATH="$MLIR_AIE_INSTALL_DIR/bin:$PATH"   # aiecc.py, aie-opt, aie-translate
  source /opt/xilinx/xrt/setup.sh                 # puts XRT's xclbinutil on PATH

mlir_aie must be """ + MLIR_AIE_MIN_TEXT + """ or newer (the MLIR we print uses
aie.runtime_sequence and func-level link_with); the aie_api headers are read from
$MLIR_AIE_INSTALL_DIR/include/aie_api. Then run this command again (`xdna kernels build --check`
only checks the toolchain)."""


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
    root, version = find_mlir_aie(env, aiecc)
    problem = mlir_aie_version_problem(version)
    if problem:
        raise ToolchainMissing([problem + (f" (mlir_aie at {root})" if root else "")])
    include = str(root / "include") if root and (root / "include" / "aie_api").is_dir() else None
    versions = {"mlir_aie": version}
    for name, tool in (("aiecc", aiecc), ("peano", peano), ("xclbinutil", xclbinutil)):
        if tool:
            rc, out, err = runner([tool, "--version"], Path.cwd())
            first = (out or err).strip().splitlines()
            versions[name] = first[0][:120] if rc == 0 and first else "unknown"
    return Toolchain(aiecc, peano, include, xclbinutil, versions)


def _dist_version(site: Path) -> str | None:
    """The mlir_aie wheel version recorded next to its package directory (dist-info METADATA)."""
    from importlib import metadata
    for dist in metadata.distributions(path=[str(site)]):
        if (dist.metadata["Name"] or "").lower().replace("-", "_") == "mlir_aie":
            return dist.version
    return None


def find_mlir_aie(env, aiecc: str | None) -> tuple[Path | None, str | None]:
    """(mlir_aie install directory, wheel version) of the installed `mlir_aie` package: the
    directory from MLIR_AIE_INSTALL_DIR, else the one aiecc.py resolves under
    (site-packages/mlir_aie/bin), else this interpreter's `mlir_aie` distribution; the version
    from the package metadata beside it (importlib.metadata). Layout per Xilinx/mlir-aie
    utils/mlir_aie_wheels/setup.py @ a0b2a0b65ac3ff9d3ee0375e5f5391b33ac0b2d8:
    site-packages/mlir_aie/{bin,include/aie_api,lib,python}."""
    from importlib import metadata
    candidates = []
    if env.get(ENV_MLIR_AIE):
        candidates.append(Path(env[ENV_MLIR_AIE]))
    if aiecc:
        candidates.append(Path(aiecc).resolve().parent.parent)
    try:
        dist = metadata.distribution("mlir_aie")
        candidates.append(Path(str(dist.locate_file("mlir_aie"))))
    except metadata.PackageNotFoundError:
        pass
    for root in candidates:
        if (root / "bin").is_dir() or (root / "include").is_dir():
            return root, _dist_version(root.parent)
    return None, None


def _version_key(version: str) -> tuple | None:
    """(dated: tuple) or (tagged: tuple) sort keys of an mlir_aie version string; None if the
    form is neither (0.0.1.YYYYMMDDHH[+hash] or X.Y.Z[.devN][+gSHA])."""
    import re
    v = version.split("+", 1)[0]
    m = re.fullmatch(r"0\.0\.1\.(\d{10})", v)
    if m:
        return ("dated", (0, 0, 1, int(m.group(1))))
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.dev(\d+))?", v)
    if m:
        dev = m.group(4)
        return ("tagged", (int(m.group(1)), int(m.group(2)), int(m.group(3)),
                           -1 if dev is not None else 0, int(dev or 0)))
    return None


def mlir_aie_version_problem(version: str | None) -> str | None:
    """Why this mlir_aie cannot build what we print (None: new enough)."""
    need = f"mlir_aie {MLIR_AIE_MIN_TEXT} or newer (aie.runtime_sequence: PR #2708; func-level " \
           f"link_with: PR #2922)"
    if version is None:
        return f"{need}: no installed mlir_aie package found (its version cannot be checked)"
    key = _version_key(version)
    if key is None:
        return f"{need}: installed mlir_aie {version} has a version form we cannot order"
    form, tup = key
    if tup < (MLIR_AIE_MIN_DATED if form == "dated" else MLIR_AIE_MIN_TAGGED):
        return f"{need}: installed mlir_aie {version} is older"
    return None


def stream_difference(ours: bytes, theirs: bytes, patch_words) -> str | None:
    """Where aiecc's instruction stream differs from ours, ignoring the words we patch per
    launch (launch scalars); None when they agree. A BD, channel or controller-id divergence
    would hang the chip, so any other difference refuses the artifact."""
    if len(ours) != len(theirs) or len(ours) % 4:
        return (f"aiecc's instruction stream has {len(theirs)} bytes, ours {len(ours)}: the "
                f"programs differ")
    allowed = set(patch_words)
    for i in range(0, len(ours), 4):
        x, y = (int.from_bytes(b[i:i + 4], "little") for b in (ours, theirs))
        if x != y and i // 4 not in allowed:
            return f"first differing word {i // 4}: ours 0x{x:08x}, aiecc's 0x{y:08x}"
    return None


# --- pieces of a build ----------------------------------------------------------------------------
def xclbin_uuid(data: bytes) -> str:
    """The xclbin's UUID as XRT's uuid.to_string() prints it, read from the axlf header."""
    magic = host.XCLBIN_MAGIC.value
    off = host.XCLBIN_UUID_OFFSET.value
    if data[:len(magic)] != magic or len(data) < off + 16:
        raise BuildError("the toolchain's xclbin has no axlf header (magic 'xclbin2'); the build "
                         "is broken or the file is not an xclbin")
    return str(uuidlib.UUID(bytes=data[off:off + 16]))


def kernel_contract_errors(program) -> list[str]:
    """How a program's kernel declarations break the C++ kernel table (kernels/aie): argument
    lists that disagree with the extern "C" signature (count, pointer or scalar, element type),
    object files not named per source and defines (kernels/aie.object_files; one object per
    source, else a core links a symbol twice), and tiles a source's static_asserts reject
    (kernels/aie.TILE_RULES). Empty: the link_with objects exist for every symbol. The contract
    array/rules.py's `kernel_signatures` rule checks (`contract=`)."""
    from torch_xdna.kernels import aie
    chain = dict(program.notes).get("chain")
    try:
        for decl in program.kernels:
            aie.check_decl(decl.symbol, decl.arg_types, chain)
        objs = aie.object_files(program.kernels, chain)
    except aie.KernelContractError as e:
        return [str(e)]
    errs = []
    for decl in program.kernels:
        obj, source, defs = objs[decl.symbol]
        if decl.object_file != obj:
            errs.append(f"core kernel {decl.symbol} declares object {decl.object_file!r}; objects "
                        f"are one per source and defines ({obj!r}), so a core linking several "
                        f"symbols of {source} gets each once")
        bad = aie.tile_errors(source, defs)
        if bad:
            errs.append(f"core kernel {decl.symbol}: {source} does not compile for this design's "
                        f"tiles: needs {'; '.join(bad)} (static_assert in the source; the plan "
                        f"chose the tile)")
    return errs


def kernel_objects(program, arch: str, gen_dir: Path | None = None) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """object file -> (core-kernel source, -D defines) for every kernel a program declares;
    BuildError on the first kernel_contract_errors. Generated kernels (fused chains,
    kernels/aie/chain_gen.py) are written to `gen_dir` (the build directory)."""
    from torch_xdna.kernels import aie
    errs = kernel_contract_errors(program)
    if errs:
        raise BuildError(f"{program.name}: {errs[0]}")
    chain = dict(program.notes).get("chain")
    objs = aie.object_files(program.kernels, chain)
    out: dict[str, tuple[Path, tuple[str, ...]]] = {}
    for decl in program.kernels:
        obj, source, defs = objs[decl.symbol]
        g = aie.generated(decl.symbol, decl.arg_types, chain)
        if g:
            if gen_dir is None:
                raise BuildError(f"{program.name}: core kernel {decl.symbol} is generated at build "
                                 "time and needs a build directory (gen_dir)")
            src = Path(gen_dir) / source
            src.write_text(g[0])
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


def new_workdir(store_root: Path, key: str) -> Path:
    """A private build directory beside the store (same filesystem: installed by rename)."""
    store_root = Path(store_root)
    store_root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".build-{key}-", dir=store_root))


def stepper(work: Path, commands: list, runner: Runner, log: Callable[[str], None],
            label: str) -> Callable[[list[str], str], None]:
    """step(argv, what): run one toolchain command in `work`; BuildError with its output tail."""
    def step(argv: list[str], what: str) -> None:
        commands.append(argv)
        log(f"  {what}: {' '.join(argv)}")
        rc, out, err = runner(argv, work)
        if rc != 0:
            tail = "\n".join((err or out).strip().splitlines()[-15:])
            raise BuildError(f"{what} failed (exit {rc}) for {label}:\n{tail}\n"
                             f"nothing was installed; rerun with --keep-build DIR to inspect the "
                             f"build directory")
    return step


def printable(program, gen: Generation, label: str) -> str:
    """The program's MLIR-AIE text, after array/rules.py and the printer's form check; a
    BuildError naming the first broken rule or the construct with no mlir-aie form."""
    from torch_xdna.array import mlir as aie_mlir
    from torch_xdna.array import rules
    broken = rules.verify(program, gen, contract=kernel_contract_errors)
    if broken:
        raise BuildError(f"{label} breaks {len(broken)} mlir-aie rule(s), first: "
                         f"{broken[0].line()}; nothing was installed (`xdna design check`)")
    try:
        return aie_mlir.to_mlir(program, gen.arch)
    except aie_mlir.MlirFormError as e:
        raise BuildError(f"{label} has no mlir-aie form: {e}") from None


def compile_kernels(program, gen: Generation, toolchain: Toolchain, work: Path, step,
                    done: set | None = None) -> None:
    """Compile the program's core-kernel objects with Peano (each object once per build)."""
    kdir = Path(__file__).resolve().parent.parent / "aie" / gen.arch
    for obj, (src, defines) in kernel_objects(program, gen.arch, gen_dir=work).items():
        if done is not None:
            if obj in done:
                continue
            done.add(obj)
        argv = [toolchain.peano_cxx, *PEANO_FLAGS, f"--target={PEANO_TARGET[gen.arch]}",
                *defines, f"-I{kdir}"]
        if toolchain.aie_include:
            argv.append(f"-I{toolchain.aie_include}")
        step(argv + ["-c", str(src), "-o", obj], f"compile {src.name} -> {obj}")


def aiecc_argv(toolchain: Toolchain, mlir: str, xclbin: str, insts: str, *extra: str) -> list[str]:
    return [toolchain.aiecc, "--aie-generate-xclbin", "--aie-generate-npu-insts",
            "--no-compile-host", "--no-xchesscc", "--no-xbridge",
            f"--peano={Path(toolchain.peano_cxx).parent.parent}", *extra,
            f"--xclbin-name={xclbin}", f"--npu-insts-name={insts}", mlir]


def install_checked(work: Path, store_root: Path, key: str, gen: Generation, design: str,
                    keep_build: Path | None) -> Path:
    """Safe modes, the backend's own validation in place, then an atomic install."""
    for p in work.iterdir():
        if p.is_file():
            os.chmod(p, 0o644)
    os.chmod(work, 0o755)
    _validate_in_place(work, key, gen, design)    # exactly as the backend will
    if keep_build is not None:
        shutil.copytree(work, keep_build, dirs_exist_ok=True)
    final = Path(store_root) / key
    _install(work, final)
    return final


def discard(work: Path, keep_build: Path | None) -> None:
    """A failed build: keep a copy if asked, remove the directory."""
    if work.exists():
        if keep_build is not None:
            shutil.copytree(work, keep_build, dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)


def build_artifact(ex: Example, gen: Generation, toolchain: Toolchain, store_root: Path, *,
                   runner: Runner = run_tool, keep_build: Path | None = None,
                   log: Callable[[str], None] = lambda s: None) -> BuildResult:
    """Build and install the artifact of one design (one array program); atomic. Staged
    designs (several programs, per-launch streams) build with toolchain/staged.py."""
    from torch_xdna.array import txn
    from torch_xdna.kernels.lower import lower

    design = ex.design
    key = design.artifact_key()
    progs = lower(design, gen)
    if len(progs) != 1:
        raise BuildError(f"{design.name} ({key}) lowers to {len(progs)} array programs; build it "
                         f"as a staged artifact (kernels/toolchain/staged.build_design)")
    program = progs[0]
    args = program.sequence.args
    if len(args) != len(ex.inputs) + len(ex.outputs):
        raise BuildError(f"{design.name}: its array program takes {len(args)} host buffers, the "
                         f"launch has {len(ex.inputs)} inputs + {len(ex.outputs)} outputs")
    work = new_workdir(store_root, key)
    commands: list[list[str]] = []
    step = stepper(work, commands, runner, log, f"{design.name} ({key})")
    try:
        (work / "design.mlir").write_text(printable(program, gen, f"{design.name} ({key})"))
        compile_kernels(program, gen, toolchain, work, step)
        nbytes = [a.type.nbytes for a in args]
        scalars = {s.name: 0 for s in program.sequence.scalars}
        ours = txn.to_bytes(txn.encode_sequence(program, txn.LaunchBinding.of(nbytes, **scalars)))
        (work / "insts.bin").write_bytes(ours)
        patches = scalar_patches(program, nbytes, txn.encode_sequence)
        step(aiecc_argv(toolchain, "design.mlir", "final.xclbin", "insts.aiecc.bin"), "aiecc.py")
        xclbin = work / "final.xclbin"
        if not xclbin.is_file():
            raise BuildError(f"aiecc.py reported success but wrote no final.xclbin in {work}")
        uid = xclbin_uuid(xclbin.read_bytes())
        # the stream the backend submits must be the one aiecc made from the same MLIR: ours
        # (bound to this launch's buffer sizes) is installed only if aiecc's equals it except
        # in the words we patch per launch; anything else is refused, naming the first word
        check_aiecc_stream(work, "insts.aiecc.bin", ours, patches.values(), f"{design.name} ({key})")
        matches = True
        kernel_dtypes = {i: DTYPES_IR_TO_TORCH[a.type.dtype] for i, a in enumerate(args[:len(ex.inputs)])
                         if DTYPES_IR_TO_TORCH.get(a.type.dtype) != _dtype_name(ex.inputs[i][1])}
        abi = abi_for([_Spec(*s) for s in ex.inputs], [_Spec(*s) for s in ex.outputs],
                      [(s.name, "float32" if s.dtype == "f32" else "int32", patches[s.name])
                       for s in program.sequence.scalars], kernel_dtypes)
        files = {"xclbin": "final.xclbin", "insts": "insts.bin"}
        tc = dict(toolchain.versions, stream_matches_aiecc=matches)
        write_manifest(work, design, gen, files, flow="xclbin", kernel="MLIR_AIE", abi=abi,
                       xclbin_uuid=uid, toolchain=tc)
        final = install_checked(work, store_root, key, gen, design.name, keep_build)
        return BuildResult(key, final, uid, files, tc, commands, matches)
    except BaseException:
        discard(work, keep_build)
        raise


def check_aiecc_stream(work: Path, name: str, ours: bytes, patch_words, label: str) -> None:
    """Refuse unless aiecc wrote `name` and it equals our stream outside the patch words."""
    theirs = work / name
    if not theirs.is_file():
        raise BuildError(f"aiecc.py wrote no instruction stream ({name}) for {label}; nothing "
                         f"was installed")
    diff = stream_difference(ours, theirs.read_bytes(), patch_words)
    if diff:
        raise BuildError(f"{label}: aiecc's instruction stream differs from ours ({diff}); "
                         f"nothing was installed")


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
