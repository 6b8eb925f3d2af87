"""Build the AIE core kernels for the host (g++ against the aie_api emulation) and load them.

The same sources that the AIE toolchain compiles for the array (aie2p/*.cc) are compiled here
with the host C++ compiler and emu/aie_api/aie.hpp standing in for AMD's aie_api, into a shared
library loaded with ctypes. That lets the test suite run every kernel against its golden without
an NPU or the Peano/Chess toolchain. Builds are cached by a hash of the compiler, flags, defines
and every source and header, in a private (0700) user cache directory; concurrent builders each
write a unique temporary file and atomically rename it into place, so a reader never sees a
partial library.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

from torch_xdna.runtime import settings
from torch_xdna.runtime.cachedir import cache_root

AIE_DIR = Path(__file__).resolve().parent
EMU_INCLUDE = AIE_DIR / "emu"
# -ffp-contract=off: no fused multiply-add, so every fp32 operation rounds once as the goldens do
CXX_FLAGS = ("-std=c++20", "-fPIC", "-ffp-contract=off", "-fno-fast-math")
DEFAULT_OPT = "-O1"


class HostBuildError(RuntimeError):
    """The host compiler is missing or rejected a kernel source."""


def kernel_dir(arch: str = "aie2p") -> Path:
    d = AIE_DIR / arch
    if not d.is_dir():
        raise HostBuildError(f"no core kernels for architecture {arch!r} (looked in {d})")
    return d


def find_compiler() -> str | None:
    """$CXX if set, else g++ or c++ on PATH; None when there is no host C++ compiler."""
    cxx = settings.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if Path(cxx).is_file() else None)
    return shutil.which("g++") or shutil.which("c++")


def cache_dir() -> Path:
    """$TORCH_XDNA_CACHE_DIR/aie-host (default ~/.cache/torch_xdna/aie-host), created 0700."""
    d = cache_root() / "aie-host"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(d, 0o700)
    except OSError as e:
        raise HostBuildError(f"cannot use {d} as the kernel build cache ({e}); set "
                             "TORCH_XDNA_CACHE_DIR to a writable directory") from e
    return d


@lru_cache(maxsize=8)
def _compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else cxx
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HostBuildError(f"host compiler {cxx} does not run: {e}") from e


def _headers(sources: Sequence[Path]) -> list[Path]:
    """Every header a kernel may include: the emulation and the kernels' own .h files."""
    dirs = {EMU_INCLUDE, kernel_dir()} | {s.parent for s in sources}
    return sorted(p for d in dirs for p in d.rglob("*") if p.suffix in (".h", ".hpp"))


def build_key(sources: Sequence[Path], defines: Mapping[str, object], cxx: str, opt: str) -> str:
    h = hashlib.sha256()
    for part in (_compiler_id(cxx), opt, *CXX_FLAGS,
                 *(f"-D{k}={v}" for k, v in sorted(defines.items()))):
        h.update(part.encode() + b"\0")
    for p in list(sources) + _headers(sources):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def build(sources: Sequence[str | Path], defines: Mapping[str, object] | None = None,
          opt: str = DEFAULT_OPT) -> Path:
    """Compile `sources` (paths, or names in aie2p/) with `defines` into a cached .so; its path."""
    cxx = find_compiler()
    if cxx is None:
        raise HostBuildError("no host C++ compiler: install g++ (e.g. `apt-get install g++`) "
                             "or set CXX to build the AIE kernels for host verification")
    srcs = [Path(s) if Path(s).is_absolute() else kernel_dir() / s for s in sources]
    for s in srcs:
        if not s.is_file():
            raise HostBuildError(f"kernel source {s} not found")
    defines = dict(defines or {})
    key = build_key(srcs, defines, cxx, opt)
    stem = "_".join(s.stem for s in srcs)[:60]
    out = cache_dir() / f"{stem}-{key}.so"
    if out.is_file():
        return out
    work = Path(tempfile.mkdtemp(prefix=f".{stem}-", dir=out.parent))
    tmp = work / "lib.so"
    defs = [f"-D{k}={v}" for k, v in sorted(defines.items())]

    def run(cmd: list[str], what: str) -> None:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise HostBuildError(f"host build of {what} failed ({' '.join(cmd)}):\n"
                                 f"{res.stderr[-4000:]}")

    try:
        objs = [work / f"{i}_{s.stem}.o" for i, s in enumerate(srcs)]
        jobs = [([cxx, *CXX_FLAGS, opt, f"-I{EMU_INCLUDE}", f"-I{kernel_dir()}", *defs, "-c", str(s), "-o", str(o)],
                 s.name) for s, o in zip(srcs, objs)]
        with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as ex:
            for f in [ex.submit(run, *j) for j in jobs]:
                f.result()
        run([cxx, "-shared", *map(str, objs), "-o", str(tmp)], "the kernel library")
        os.chmod(tmp, 0o700)
        os.replace(tmp, out)                     # atomic: readers see no file or the whole file
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def load(sources: Sequence[str | Path], defines: Mapping[str, object] | None = None,
         opt: str = DEFAULT_OPT) -> ctypes.CDLL:
    """build() and dlopen the result; symbols are the kernels' extern "C" names."""
    return ctypes.CDLL(str(build(sources, defines, opt)))


# --- calling a kernel with torch tensors -----------------------------------------------------
_PTR_DTYPES = {"bf16*": "bfloat16", "f32*": "float32", "i8*": "int8", "u8*": "uint8",
               "i32*": "int32", "bfp16*": "uint8"}
_SCALARS = {"i32": ctypes.c_int32, "f32": ctypes.c_float}


def bind(lib: ctypes.CDLL, symbol: str):
    """A Python callable for `symbol` of a loaded library: tensors for pointer arguments
    (dtype and contiguity checked against the kernel table), ints/floats for scalars."""
    import torch

    from torch_xdna.kernels.aie import KERNELS

    spec = KERNELS.get(symbol)
    if spec is None:
        raise HostBuildError(f"unknown core kernel {symbol!r}; known: {', '.join(sorted(KERNELS))}")
    fn = getattr(lib, symbol)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p if t.endswith("*") else _SCALARS[t] for _, t in spec.args]

    def call(*args):
        if len(args) != len(spec.args):
            raise TypeError(f"{symbol} takes {len(spec.args)} arguments "
                            f"({', '.join(n for n, _ in spec.args)}), got {len(args)}")
        conv = []
        for (name, typ), a in zip(spec.args, args):
            if typ.endswith("*"):
                want = getattr(torch, _PTR_DTYPES[typ])
                if not isinstance(a, torch.Tensor) or a.dtype != want or not a.is_contiguous():
                    got = a.dtype if isinstance(a, torch.Tensor) else type(a).__name__
                    raise TypeError(f"{symbol}: argument {name} must be a contiguous {want} "
                                    f"tensor, got {got}")
                conv.append(a.data_ptr())
            else:
                conv.append(int(a) if typ == "i32" else float(a))
        fn(*conv)

    call.__name__ = symbol
    return call
