"""Hardware artifacts: one directory per design, described by a manifest, validated fail-closed.

Layout: ``$TORCH_XDNA_ARTIFACT_DIR/<design.artifact_key()>/manifest.json`` plus the files it lists.
Nothing reaches XRT until the manifest and every file in it pass: a regular file (no symlink),
owned by this user or root, not group/other-writable, exact size and SHA-256, built for this
generation. Instruction streams are read from the same descriptor that was hashed.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from torch_xdna.hw import GENERATIONS, host
from torch_xdna.runtime import settings
from torch_xdna.runtime.errors import XdnaError

MANIFEST = "manifest.json"
SCHEMA = 1
ENV_DIR = "TORCH_XDNA_ARTIFACT_DIR"
FLOWS = {"xclbin": ("xclbin", "insts"), "elf": ("elf",),    # flow -> file roles it needs
         "staged": ("xclbin",)}   # one kernel per stage configuration (+ "insts.<j>" per fixed stage)
BUFFER_ROLES = ("input", "output", "scratch")
STREAM_MODES = ("fixed", "host")
ROLES = ("input", "output", "scalar")
SCALAR_DTYPES = ("int32", "uint32", "float32")     # 32-bit words patched into the stream
STREAM_HEADER_WORDS = 4                            # the transaction header precedes every op
_CHUNK = 1 << 20


class ArtifactError(XdnaError):
    """An artifact is missing or failed validation; nothing was loaded onto the NPU."""


_HEX = frozenset("0123456789abcdef")


def canonical_uuid(text: str) -> str | None:
    """The one form UUIDs are compared in: 36-char dashed lower case, as XRT's
    `uuid.to_string()` returns it (uuid_unparse_lower, Xilinx/XRT xrt_uuid.h). Accepts the dashed
    and the undashed (32 hex digit) forms, any case, optional braces; None when it is not a UUID."""
    h = str(text).strip().strip("{}").replace("-", "").lower()
    if len(h) != 32 or not set(h) <= _HEX:
        return None
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def default_artifact_dir() -> Path:
    env = settings.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    data = settings.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "torch-xdna" / "artifacts"


@dataclass(frozen=True)
class ArgSpec:
    """One kernel argument in launch order: an input/output tensor region or a scalar."""

    role: str
    index: int = 0              # position in launch.inputs / launch.outputs
    name: str = ""              # scalar name in launch.scalars
    dtype: str = ""             # the dtype the *kernel* takes (torch name without "torch.")
    shape: tuple[int, ...] = ()
    patch: int = -1             # scalars: 32-bit word of the instruction stream that carries it

    @property
    def is_buffer(self) -> bool:
        return self.role != "scalar"

    def to_json(self) -> dict:
        d = {"role": self.role, "index": self.index, "dtype": self.dtype, "shape": list(self.shape)}
        if self.role == "scalar":
            d = {"role": "scalar", "name": self.name, "dtype": self.dtype, "patch": self.patch}
        return d


@dataclass(frozen=True)
class Artifact:
    """A validated artifact, ready to load."""

    key: str
    directory: Path
    generation: str
    flow: str                       # "xclbin" (xclbin + instruction stream) | "elf" (full ELF)
    kernel: str                     # xclbin kernel name, or "<device>:<sequence>" in an ELF
    files: dict[str, Path]
    abi: tuple[ArgSpec, ...]
    xclbin_uuid: str = ""
    num_bo_args: int = 0            # declared BO arguments (ELF flow; xclbin flow reads the xclbin)
    insts: bytes = b""              # the validated instruction stream (xclbin flow)
    toolchain: dict = field(default_factory=dict)
    sha256: dict = field(default_factory=dict)
    launch: "LaunchAbi | None" = None   # staged flow: buffers and stages (check_launch)
    stage_insts: dict = field(default_factory=dict)   # stage index -> its fixed stream

    @property
    def buffer_args(self) -> list[ArgSpec]:
        return [a for a in self.abi if a.is_buffer]


@dataclass(frozen=True)
class StageSpec:
    """One kernel run of a staged launch: its xclbin kernel, configuration digest, the buffers
    it takes (by name, in kernel-argument order) and how its stream is made."""

    label: str
    kernel: str
    config: str
    args: tuple[str, ...]
    stream: str                 # "fixed" (file role `insts`) | "host" (encoded per launch)
    insts: str = ""


@dataclass(frozen=True)
class LaunchAbi:
    """A staged launch: named buffers (launch inputs/outputs, then scratch) and its stages."""

    buffers: tuple[dict, ...]
    stages: tuple[StageSpec, ...]
    host_layout: str = ""       # the inputs are packed on the host first (registered packer)
    why_not_executable: str = ""    # structural stages: refused at run time with this reason

    @property
    def kernel_runs(self) -> int:
        return len(self.stages)

    def configure_points(self, previous: str | None = None) -> int:
        """Stages whose configuration differs from the one before (the array's `previous`)."""
        n, cur = 0, previous
        for st in self.stages:
            n += st.config != cur
            cur = st.config
        return n


def config_digest(program) -> str:
    """SHA-256 of an ArrayProgram's static configuration (tiles, FIFOs, links, buffers, kernels,
    core bodies and the runtime sequence's argument types): what its xclbin kernel is compiled
    from. A per-launch stream must belong to the configuration its stage was built for."""
    static = (program.generation, program.tiles, program.fifos, program.links, program.buffers,
              program.kernels, program.cores, tuple(a.type for a in program.sequence.args))
    return hashlib.sha256(repr(static).encode()).hexdigest()


def check_launch(key: str, where: str, launch, files: dict | None = None) -> LaunchAbi:
    """Validate a manifest's "launch" entry (kernels/toolchain/launch_abi.py writes it): buffer
    roles and unique names, inputs and outputs numbered from 0 in order, scratch sizes, each
    stage's kernel name, 64-hex configuration digest, arguments that name known buffers, and a
    listed instruction file for every fixed stream. Raises ArtifactError naming the problem."""
    fix = "rebuild the artifact with `xdna kernels build`"
    if not isinstance(launch, dict):
        raise _fail(key, where, "field 'launch' is not an object", fix)
    bufs, stages = launch.get("buffers"), launch.get("stages")
    if not isinstance(bufs, list) or not bufs or not isinstance(stages, list) or not stages:
        raise _fail(key, where, "launch needs non-empty 'buffers' and 'stages' lists", fix)
    names, counts = set(), {"input": 0, "output": 0}
    for b in bufs:
        if not isinstance(b, dict) or b.get("role") not in BUFFER_ROLES or not b.get("name") \
                or not isinstance(b.get("shape"), list) or not isinstance(b.get("dtype"), str):
            raise _fail(key, where, f"launch buffer {b!r} needs a name, a role in {BUFFER_ROLES}, "
                        "a dtype and a shape", fix)
        if b["name"] in names:
            raise _fail(key, where, f"launch buffer {b['name']!r} is listed twice", fix)
        names.add(b["name"])
        role = b["role"]
        if role in counts:
            if b.get("index") != counts[role]:
                raise _fail(key, where, f"launch buffer {b['name']!r} is {role} {b.get('index')!r}; "
                            f"{role}s are numbered in launch order from 0 (expected {counts[role]})", fix)
            counts[role] += 1
        elif not isinstance(b.get("nbytes"), int) or b["nbytes"] <= 0:
            raise _fail(key, where, f"scratch buffer {b['name']!r} needs a positive 'nbytes'", fix)
    specs = []
    for j, st in enumerate(stages):
        if not isinstance(st, dict):
            raise _fail(key, where, f"stage {j} is not an object", fix)
        kernel, cfg, args, mode = st.get("kernel"), st.get("config"), st.get("args"), st.get("stream")
        if not isinstance(kernel, str) or not kernel:
            raise _fail(key, where, f"stage {j} names no xclbin kernel", fix)
        if not isinstance(cfg, str) or len(cfg) != 64 or not set(cfg) <= _HEX:
            raise _fail(key, where, f"stage {j} ({kernel}) has no 64-hex configuration digest", fix)
        if not isinstance(args, list) or not args or any(a not in names for a in args):
            bad = [a for a in args or () if a not in names] if isinstance(args, list) else args
            raise _fail(key, where, f"stage {j} ({kernel}) takes buffers {bad!r} the launch does not "
                        "declare", fix)
        if mode not in STREAM_MODES:
            raise _fail(key, where, f"stage {j} ({kernel}) stream {mode!r} is not one of "
                        f"{', '.join(STREAM_MODES)}", fix)
        role = st.get("insts") or ""
        if mode == "fixed" and files is not None and role not in files:
            raise _fail(key, where, f"stage {j} ({kernel}) has a fixed stream but its file "
                        f"{role!r} is not listed in 'files'", fix)
        specs.append(StageSpec(str(st.get("label", "")), kernel, cfg, tuple(args), mode, role))
    why = "" if launch.get("executable", True) else str(launch.get("why") or "structural stages")
    return LaunchAbi(tuple(bufs), tuple(specs), str(launch.get("host_layout") or ""), why)


def _fail(key: str, what: str, problem: str, fix: str) -> ArtifactError:
    return ArtifactError(f"xdna artifact {key}: {what}: {problem}. Fix: {fix}. "
                         f"(Or run on the simulator: TORCH_XDNA_BACKEND=sim)")


def _check_stat(key: str, path: Path, st: os.stat_result, owners: set[int], kind: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _fail(key, str(path), "is a symlink; artifacts must be the files themselves",
                    f"replace it with the real file (cp --remove-destination \"$(readlink -f {path})\" {path})")
    want = stat.S_ISDIR if kind == "dir" else stat.S_ISREG
    if not want(st.st_mode):
        raise _fail(key, str(path), f"is not a {'directory' if kind == 'dir' else 'regular file'}",
                    "reinstall the artifact")
    if st.st_uid not in owners:
        raise _fail(key, str(path), f"is owned by uid {st.st_uid}, not by you or root",
                    f"chown {os.geteuid()} {path} (only you or root may own artifacts you load)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _fail(key, str(path), f"is group/other-writable (mode {stat.S_IMODE(st.st_mode):04o})",
                    f"chmod go-w {path}")


def _open_checked(key: str, path: Path, owners: set[int]) -> int:
    """An fd for a regular, safely-owned file; refuses symlinks in the last component."""
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        raise _fail(key, str(path), "is missing", "reinstall the artifact (rebuild it, or copy every "
                    "file manifest.json lists into its directory)") from None
    _check_stat(key, path, lst, owners, "file")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if (st.st_ino, st.st_dev) != (lst.st_ino, lst.st_dev):
            raise _fail(key, str(path), "changed while it was being opened", "reinstall the artifact")
        _check_stat(key, path, st, owners, "file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def check_stream_header(key: str, path: Path, insts: bytes, generation: str) -> None:
    """Refuse an instruction stream whose transaction header disagrees with its size or with this
    NPU's generation, before anything is submitted (the firmware would reject or misread it)."""
    hw = host.TXN_HEADER_WORDS.value
    if len(insts) < 4 * hw or len(insts) % 4:
        raise _fail(key, str(path), f"is {len(insts)} bytes: too short for the {hw}-word transaction "
                    "header, or not whole 32-bit words", "rebuild the artifact")
    w0, _w1, n_ops, size = struct.unpack_from("<4I", insts)
    if size != len(insts):
        raise _fail(key, str(path), f"header says {size} bytes, the stream is {len(insts)}",
                    "the stream is truncated or was edited: rebuild the artifact")
    gen = GENERATIONS.get(generation)
    allowed = host.TXN_DEVICE_GENS.value.get(gen.arch, ()) if gen is not None else ()
    dev_gen = (w0 >> 16) & 0xFF
    if allowed and dev_gen not in allowed:
        raise _fail(key, str(path), f"header device generation {dev_gen} is not {generation}'s "
                    f"({'/'.join(map(str, allowed))} for {gen.arch})",
                    f"rebuild the artifact for {generation}")
    if n_ops == 0:
        raise _fail(key, str(path), "header counts no operations", "rebuild the artifact")


class ArtifactStore:
    """Looks artifacts up by key and validates them (once per process per key)."""

    def __init__(self, directory: Path | None = None, owners: set[int] | None = None):
        self.directory = Path(directory) if directory is not None else default_artifact_dir()
        self.owners = owners if owners is not None else {os.geteuid(), 0}
        self._valid: dict[tuple[str, str], Artifact] = {}

    def has_any(self) -> bool:
        try:
            return any((d / MANIFEST).exists() for d in self.directory.iterdir())
        except OSError:
            return False

    def lookup(self, key: str, generation: str, design: str = "") -> Artifact:
        hit = self._valid.get((key, generation))
        if hit is None:
            hit = self.validate(key, generation, design)
            self._valid[(key, generation)] = hit
        return hit

    def forget(self, key: str | None = None) -> None:
        """Drop cached validations (re-checked on next lookup)."""
        self._valid = {k: v for k, v in self._valid.items() if key is not None and k[0] != key}

    def validate(self, key: str, generation: str, design: str = "") -> Artifact:
        root = self.directory
        d = root / key
        label = f"{design} ({key})" if design else key
        if not d.exists() and not d.is_symlink():
            raise ArtifactError(
                f"xdna: no hardware artifact for {label} in {root} (set by {ENV_DIR}). The xrt backend "
                f"never runs a design on the host: build it for {generation} with `xdna kernels "
                f"build` (a model's designs: --model DIR with the --max-context and --prefill-chunk "
                f"the engine runs with; it installs {d}/{MANIFEST} and its files), or use "
                f"TORCH_XDNA_BACKEND=sim.")
        _check_stat(key, d, os.lstat(d), self.owners, "dir")
        fd = _open_checked(key, d / MANIFEST, self.owners)
        try:
            raw = _read_fd(fd)
        finally:
            os.close(fd)
        try:
            m = json.loads(raw)
        except ValueError as e:
            raise _fail(key, str(d / MANIFEST), f"is not valid JSON ({e})", "reinstall the artifact") from None
        return self._from_manifest(key, generation, d, m)

    def _from_manifest(self, key: str, generation: str, d: Path, m: dict) -> Artifact:
        mpath = str(d / MANIFEST)

        def need(name: str, typ: type):
            v = m.get(name)
            if not isinstance(v, typ):
                raise _fail(key, mpath, f"field {name!r} is missing or not a {typ.__name__}",
                            "regenerate the manifest with torch_xdna.kernels.toolchain.artifacts.write_manifest")
            return v

        if m.get("schema") != SCHEMA:
            raise _fail(key, mpath, f"schema {m.get('schema')!r} is not {SCHEMA}", "rebuild the artifact")
        if need("artifact_key", str) != key:
            raise _fail(key, mpath, f"describes artifact {m['artifact_key']!r}, not this design's {key!r}",
                        "install the artifact under the directory named by its own key")
        gen = need("generation", str)
        if gen != generation:
            raise _fail(key, mpath, f"was built for {gen}; this NPU is {generation}",
                        f"build the design for {generation}")
        flow = need("flow", str)
        if flow not in FLOWS:
            raise _fail(key, mpath, f"flow {flow!r} is not one of {', '.join(FLOWS)}", "rebuild the artifact")
        kernel = need("kernel", str)
        files = need("files", dict)
        paths, hashes, insts = {}, {}, b""
        for role in FLOWS[flow]:
            entry = files.get(role)
            if not isinstance(entry, dict):
                raise _fail(key, mpath, f"lists no {role!r} file (the {flow} flow needs "
                            f"{', '.join(FLOWS[flow])})", "regenerate the manifest from the build outputs")
            path, data = self._check_file(key, d, role, entry, keep=(role == "insts"))
            paths[role], hashes[role] = path, entry["sha256"]
            if role == "insts":
                insts = data
        launch, stage_insts = None, {}
        if flow == "staged":
            launch = check_launch(key, mpath, m.get("launch"), files)
            for j, st in enumerate(launch.stages):
                if st.stream == "fixed":
                    path, data = self._check_file(key, d, st.insts, files[st.insts], keep=True)
                    check_stream_header(key, path, data, gen)
                    paths[st.insts], hashes[st.insts], stage_insts[j] = path, files[st.insts]["sha256"], data
        uuid = ""
        if flow in ("xclbin", "staged"):
            raw_uuid = need("xclbin_uuid", str)
            uuid = canonical_uuid(raw_uuid)
            if uuid is None:
                raise _fail(key, mpath, f"xclbin_uuid {raw_uuid!r} is not a UUID (32 hex digits, "
                            "dashed or not)", "regenerate the manifest from the build's xclbin")
            if flow == "xclbin":
                check_stream_header(key, paths["insts"], insts, gen)
        nbo = m.get("num_bo_args", 0)
        abi = tuple(self._arg(key, mpath, a) for a in need("abi", list))
        words = len(insts) // 4
        for a in abi:
            if a.role != "scalar":
                continue
            if a.dtype not in SCALAR_DTYPES:
                raise _fail(key, mpath, f"scalar {a.name!r} has dtype {a.dtype!r}, not one of "
                            f"{', '.join(SCALAR_DTYPES)}", "rebuild the artifact")
            # pyxrt's kernel(...) silently drops arguments it cannot convert, and aiecc kernels
            # take no scalars at all: a runtime parameter must be patched into the stream
            if flow != "xclbin" or not STREAM_HEADER_WORDS <= a.patch < words:
                raise _fail(key, mpath, f"scalar {a.name!r} has no instruction-stream patch word "
                            f"(patch={a.patch}, stream has {words} words); pyxrt would drop it "
                            "silently", "rebuild the artifact with `xdna kernels build` (runtime "
                            "parameters are patched into the instruction stream)")
        if flow == "elf" and (not isinstance(nbo, int) or nbo < len([a for a in abi if a.is_buffer])):
            raise _fail(key, mpath, "num_bo_args must be an int >= the number of buffer arguments "
                        "in abi", "regenerate the manifest")
        return Artifact(key=key, directory=d, generation=gen, flow=flow, kernel=kernel, files=paths,
                        abi=abi, xclbin_uuid=uuid, num_bo_args=int(nbo or 0), insts=insts,
                        toolchain=dict(m.get("toolchain") or {}), sha256=hashes, launch=launch,
                        stage_insts=stage_insts)

    def _check_file(self, key: str, d: Path, role: str, entry: dict, keep: bool) -> tuple[Path, bytes]:
        name, size, digest = entry.get("path"), entry.get("size"), entry.get("sha256")
        if (not isinstance(name, str) or not name or "/" in name or name in (".", "..")
                or not isinstance(size, int) or not isinstance(digest, str)):
            raise _fail(key, str(d / MANIFEST), f"files[{role!r}] needs a plain file name, an int "
                        "size and a sha256", "regenerate the manifest")
        path = d / name
        fd = _open_checked(key, path, self.owners)
        try:
            st = os.fstat(fd)
            if st.st_size != size:
                raise _fail(key, str(path), f"is {st.st_size} bytes, the manifest says {size}",
                            "the file is truncated or replaced: reinstall it from a trusted build")
            h, kept = hashlib.sha256(), []
            while chunk := os.read(fd, _CHUNK):
                h.update(chunk)
                if keep:
                    kept.append(chunk)
        finally:
            os.close(fd)
        if h.hexdigest() != digest.lower():
            raise _fail(key, str(path), f"SHA-256 {h.hexdigest()[:16]}... does not match the manifest's "
                        f"{digest[:16]}...", "the file was modified: reinstall it from a trusted build")
        return path, b"".join(kept)

    @staticmethod
    def _arg(key: str, mpath: str, a) -> ArgSpec:
        if not isinstance(a, dict) or a.get("role") not in ROLES:
            raise _fail(key, mpath, f"abi entry {a!r} needs a role in {ROLES}", "regenerate the manifest")
        if a["role"] == "scalar":
            patch = a.get("patch", -1)
            return ArgSpec("scalar", name=str(a.get("name", "")), dtype=str(a.get("dtype", "")),
                           patch=patch if isinstance(patch, int) and not isinstance(patch, bool) else -1)
        return ArgSpec(a["role"], int(a.get("index", 0)), dtype=str(a.get("dtype", "")),
                       shape=tuple(int(s) for s in a.get("shape", ())))
