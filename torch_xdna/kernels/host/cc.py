"""Building the host kernels' C sources (simulator speed): one place for the compile-and-load
step and the TORCH_XDNA_HOST_KERNELS switch, shared by host_gemv and host_fused.

A source is compiled once per process with a plain C compiler (~1 s) into a private temp
directory (0700) and loaded with ctypes; no library is cached on disk (a cached .so would be code
another writer of the cache could replace). -ffp-contract=off: a kernel's float operations are
exactly the ones its source writes (no fused multiply-add unless it asks for one).
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile

from torch_xdna.runtime import settings

FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC")


def enabled() -> bool:
    """TORCH_XDNA_HOST_KERNELS=0 (off/false/no) disables every host kernel."""
    return settings.get("TORCH_XDNA_HOST_KERNELS")


def build_once(state: dict, lock, build, on_error=None) -> bool:
    """A kernel module's lazy build: state["ok"] from build() on the first call (thread-safe),
    cached after; False while the kernels are disabled. A host without AVX2 + FMA, or build()
    raising (no compiler, a missing torch symbol), leaves the reason in state["why"] and calls
    on_error(reason) once (a module that wants to warn)."""
    if not enabled():
        return False
    ok = state.get("ok")
    if ok is None:
        with lock:
            ok = state.get("ok")
            if ok is None:
                why = cpu_reason()
                if why is None:
                    try:
                        ok = bool(build())
                    except Exception as e:          # noqa: BLE001 - any failure: torch path
                        why = f"{type(e).__name__}: {e}"
                if why is not None:
                    state["why"], ok = why, False
                    if on_error is not None:
                        on_error(why)
                state["ok"] = ok
    return bool(ok)


def torch_symbol(name: str, what: str) -> int:
    """The address of `name` exported by the loaded libtorch_cpu (an MKL function torch's own
    ops call, so a kernel computes exactly what they do); RuntimeError naming `what` else."""
    import torch
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        addr = ctypes.cast(getattr(ctypes.CDLL(path), name), ctypes.c_void_p).value
    except (OSError, AttributeError) as e:
        raise RuntimeError(f"no {name} in {path} ({e}): {what}") from None
    if not addr:
        raise RuntimeError(f"{name} in {path} has no address: {what}")
    return addr


def unavailable_reason(state: dict, ok: bool) -> str:
    """Why a kernel module is not in use ("" when it is)."""
    return "" if ok else str(state.get("why", "disabled (TORCH_XDNA_HOST_KERNELS=0)"))


def thread_pool(state: dict, nt: int, name: str):
    """The kernel module's worker pool of `nt` threads (kept in `state`; a new thread count
    replaces it, the old pool is shut down)."""
    from concurrent.futures import ThreadPoolExecutor
    pool = state.get("pool")
    if pool is None or state.get("pool_n") != nt:
        if pool is not None:
            pool.shutdown(wait=False)
        pool = state["pool"] = ThreadPoolExecutor(nt, thread_name_prefix=name)
        state["pool_n"] = nt
    return pool


def compile_library(source: str, name: str) -> ctypes.CDLL:
    """Compile `source` into a private temp dir and load it; raises RuntimeError naming the
    compiler's last error line when it cannot be built."""
    cc = settings.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    with tempfile.TemporaryDirectory(prefix=f"xdna-{name}-") as d:
        src, lib = os.path.join(d, f"{name}.c"), os.path.join(d, f"{name}.so")
        with open(src, "w") as f:
            f.write(source)
        r = subprocess.run([cc, *FLAGS, "-o", lib, src], capture_output=True, text=True,
                           timeout=300)
        if r.returncode:
            raise RuntimeError(f"{cc} failed: {r.stderr.strip().splitlines()[-1:]}")
        return ctypes.CDLL(lib)                  # mapped: the file may go with the directory


_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}


def void_fn(lib: ctypes.CDLL, name: str, sig: str):
    """lib.name as a void C function of the argument types in `sig`, one letter each:
    p pointer, i int64, f float (e.g. "ppi" for (const float*, float*, int64_t))."""
    fn = getattr(lib, name)
    fn.restype = None
    fn.argtypes = [_CTYPES[c] for c in sig]
    return fn


def cpu_reason() -> str | None:
    """Why this host cannot run the AVX2 + FMA kernels (None when it can)."""
    import torch
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        return f"host CPU capability {cap} (the host kernels need AVX2 + FMA)"
    return None
