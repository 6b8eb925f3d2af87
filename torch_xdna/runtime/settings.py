"""Every environment variable torch-xdna reads, declared once: name, kind, default, allowed values
and what it does. Reads go through `get(name)`, so a bad value fails the same way everywhere -- one
message naming the variable, the value and what to set instead -- rather than an OverflowError or a
silently ignored typo deep inside the runtime; `xdna info --env` and the README table list the same
variables (tests/test_settings.py keeps them in step).

Reads are lazy (each `get` looks at os.environ now), because tests and long-lived processes change
variables at run time. This module imports nothing above runtime/errors (the generation names come
from hw/ on demand), so every layer can use it.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Union

from torch_xdna.runtime.errors import XdnaError

__all__ = ["EnvError", "Setting", "SETTINGS", "get", "choices", "describe", "read_raw",
           "bound_native_caches"]

CHOICE, INTEGER, NUMBER, FLAG, PATH, TEXT = "choice", "integer", "number", "flag", "path", "text"
FLAG_ON = ("1", "on", "true", "yes")
FLAG_OFF = ("0", "off", "false", "no")

Value = Union[str, int, float, bool, None]


class EnvError(XdnaError, ValueError):
    """An environment variable holds a value outside its accepted form."""


def _generation_names() -> tuple[str, ...]:
    from torch_xdna.hw.generations import GENERATIONS     # hw/ is data only: no circle, no torch
    return tuple(GENERATIONS)


@dataclass(frozen=True)
class Setting:
    """One environment variable. `allowed` is a tuple of values (or a function returning them, for
    lists owned elsewhere); `unit` and `allow_zero` describe numbers; `reader` is who reads it
    ("torch" for PyTorch's own switch, which this package only documents); `internal` marks test
    hooks that the README does not list; `secret` values are never printed."""

    name: str
    kind: str
    default: Value
    doc: str
    allowed: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    noun: str = ""                     # "a backend": the message for a value outside `allowed`
    unit: str = ""
    allow_zero: bool = False
    reader: str = "torch_xdna"
    internal: bool = False
    secret: bool = False

    def choices(self) -> tuple[str, ...]:
        if self.kind == FLAG:
            return FLAG_ON + FLAG_OFF
        return self.allowed() if callable(self.allowed) else self.allowed

    def parse(self, raw: str) -> Value:
        """`raw` (not blank) as this setting's value, or EnvError naming what to set instead."""
        if self.kind == CHOICE:
            return self._choice(raw)
        if self.kind == FLAG:
            v = raw.strip().lower()
            if v in FLAG_ON or v in FLAG_OFF:
                return v in FLAG_ON
            raise EnvError(f"{self.name}={raw!r} is not a switch; set it to 1 (on) or 0 (off), "
                           "or unset it")
        if self.kind in (INTEGER, NUMBER):
            return self._number(raw)
        return raw

    def _choice(self, raw: str) -> str:
        v = raw.strip().lower()
        allowed = self.choices()
        if v not in allowed:
            raise EnvError(f"{self.name}={v!r} is not {self.noun or 'allowed'}; use one of "
                           f"{', '.join(allowed)} (default {self.default}), or unset it")
        return v

    def _number(self, raw: str) -> int | float:
        lower = "0 or more" if self.allow_zero else "greater than 0"
        form = f"a finite number {lower}" + (f" ({self.unit})" if self.unit else "")
        try:
            value = float(raw.strip())
        except ValueError:
            raise EnvError(f"{self.name}={raw!r} is not a number; set it to {form}, or unset it") \
                from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not self.allow_zero):
            raise EnvError(f"{self.name}={raw!r} is not allowed; set it to {form}, or unset it")
        if self.kind == INTEGER:                 # rounds down: "1e9" is accepted for bytes
            value = int(value)
            if value == 0 and not self.allow_zero:
                raise EnvError(f"{self.name}={raw!r} rounds to 0; set it to {form}, or unset it")
        return value


_TABLE = (
    # --- runtime -------------------------------------------------------------------------------
    Setting("TORCH_XDNA_BACKEND", CHOICE, "auto", "runtime backend; auto picks xrt when an NPU, "
            "pyxrt and kernel artifacts are present, else sim", ("auto", "sim", "xrt"), "a backend"),
    Setting("TORCH_XDNA_GENERATION", CHOICE, "npu4", "NPU generation the simulator models",
            _generation_names, "an NPU generation"),
    Setting("TORCH_XDNA_MEMORY_BUDGET", INTEGER, None, "device memory budget (default: the "
            "NPU-reachable share of RAM)", unit="bytes, e.g. 4e9"),
    Setting("TORCH_XDNA_ARTIFACT_DIR", PATH, None, "kernel artifacts for the xrt backend "
            "(default $XDG_DATA_HOME/torch-xdna/artifacts)"),
    Setting("TORCH_XDNA_TIMEOUT_MS", INTEGER, None, "xrt launch timeout (default: the driver's "
            "job timeout)", unit="milliseconds"),
    Setting("TORCH_XDNA_XRT", CHOICE, "pyxrt", "what the xrt backend drives: pyxrt (a physical "
            "NPU) or emulated (the emulated NPU: artifacts' streams run with host-compiled core "
            "kernels; results are emulated, never hardware results)", ("pyxrt", "emulated"),
            "an XRT implementation"),
    Setting("TORCH_XDNA_XRT_DEBUG", FLAG, False, "the emulated NPU refuses a run whose BO was "
            "written on the host and not synced to the device (naming it)"),
    Setting("TORCH_XDNA_CACHE_DIR", PATH, None, "compile, weight and host-build caches (default "
            "$XDG_CACHE_HOME/torch_xdna; private 0700, entries signed)"),
    Setting("TORCH_XDNA_CACHE_KEY_FILE", PATH, None, "the per-user key cache entries are signed "
            "with (default $XDG_CONFIG_HOME/torch-xdna/cache.key)"),
    # --- simulator -----------------------------------------------------------------------------
    Setting("TORCH_XDNA_SIM_LEVEL", CHOICE, "functional", "the simulator's execution level: txn "
            "decodes each launch's instruction stream and moves the data through the array program",
            ("functional", "txn"), "a simulation level"),
    Setting("TORCH_XDNA_SIM_WEIGHT_CACHE_MB", NUMBER, 3072.0, "host-side cache of prepared LLM "
            "weights in the simulator (no effect on counters)", unit="MiB; 0 disables the cache",
            allow_zero=True),
    Setting("TORCH_XDNA_GEMM_ORDER", CHOICE, "plan", "functional GEMM accumulation: plan follows "
            "the design's K tiles (bit-identical to txn), blas one host matmul, kernel the C++ core "
            "kernels' own order (bit-identical to the emulated NPU)",
            ("plan", "blas", "kernel"), "a GEMM order"),
    Setting("TORCH_XDNA_LAYER_ORDER", CHOICE, "blas", "fused decoder layer reference: blas host-"
            "speed fp32 GEMMs, plan the stage programs' order (bit-identical to txn)",
            ("blas", "plan"), "a layer order"),
    Setting("TORCH_XDNA_HOST_KERNELS", FLAG, True, "the simulator's AVX2 host kernels (compiled "
            "with $CC once per process); 0 runs the torch ops"),
    # --- device and commands -------------------------------------------------------------------
    Setting("TORCH_XDNA_FALLBACK", CHOICE, "warn", "what ops without an NPU kernel do",
            ("warn", "error", "silent"), "a fallback mode"),
    Setting("TORCH_XDNA_WHISPER_MODEL", PATH, None, "default Whisper (or Parakeet) directory for xdna transcribe"),
    Setting("XDNA_API_KEY", TEXT, None, "API key xdna serve requires when --api-key is not given",
            secret=True),
    Setting("XDNA_DEBUG", FLAG, False, "the xdna command also prints an error's Python traceback "
            "(same as --debug)"),
    Setting("TORCH_DEVICE_BACKEND_AUTOLOAD", FLAG, True, "PyTorch's switch (0) to not autoload "
            "this package on import torch", reader="torch"),
    Setting("LRU_CACHE_CAPACITY", INTEGER, 16, "PyTorch's per-thread cache of oneDNN (ideep) "
            "matmul / linear primitives, one per input shape (~0.7 MB with oneDNN's copy); torch's own default "
            "(1,024) lets a server's memory grow with every new prompt or batch length, so "
            "torch-xdna sets 16 when unset (0 crashes this torch)", unit="primitives",
            reader="torch"),
    Setting("ONEDNN_PRIMITIVE_CACHE_CAPACITY", INTEGER, 16, "oneDNN's own primitive cache, "
            "bounded with LRU_CACHE_CAPACITY for the same reason (torch-xdna sets 16 when unset; "
            "0 disables it)", unit="primitives", allow_zero=True, reader="oneDNN"),
    # --- toolchains and standard locations -----------------------------------------------------
    Setting("CC", TEXT, None, "C compiler for the simulator's host kernels (default cc, else gcc)"),
    Setting("CXX", TEXT, None, "C++ compiler for the host build of the AIE core kernels "
            "(default g++, else c++)"),
    Setting("PEANO_INSTALL_DIR", PATH, None, "Peano (llvm-aie) install, for xdna kernels build"),
    Setting("MLIR_AIE_INSTALL_DIR", PATH, None, "mlir-aie install for xdna kernels build (default: "
            "beside aiecc.py on PATH)"),
    Setting("XDG_CACHE_HOME", PATH, None, "base of the default cache dir (default ~/.cache)"),
    Setting("XDG_CONFIG_HOME", PATH, None, "base of the default cache key file (default ~/.config)"),
    Setting("XDG_DATA_HOME", PATH, None, "base of the default artifact dir and xdna pull's model "
            "dir (default ~/.local/share)"),
    Setting("HF_ENDPOINT", TEXT, None, "the Hugging Face Hub xdna pull downloads from (read by "
            "huggingface_hub; default https://huggingface.co)", reader="huggingface_hub"),
    # --- test hooks ----------------------------------------------------------------------------
    Setting("XDNA_TEST_CORPUS_KILL_AFTER", INTEGER, None, "test hook: a corpus job SIGKILLs itself "
            "after this many committed chunks", unit="chunks", internal=True),
)

SETTINGS: dict[str, Setting] = {s.name: s for s in _TABLE}


def read_raw(name: str) -> str | None:
    """The variable's text as set, None when unset or blank (blank means unset everywhere)."""
    raw = os.environ.get(SETTINGS[name].name)
    return raw if raw is not None and raw.strip() else None


_thread = threading.local()             # per-thread overrides: name -> parsed value


def get(name: str, fallback: Value = None) -> Value:
    """The current value of the declared variable `name`, parsed: this thread's `override` when
    one is active, else the environment; unset or blank gives `fallback` when one is passed (a
    caller-specific default, e.g. a generation's own timeout), else the table's default. A
    KeyError for an undeclared name: declare it in the table first."""
    setting = SETTINGS[name]
    local = getattr(_thread, "values", None)
    if local and name in local:
        return local[name]
    raw = read_raw(name)
    if raw is not None:
        return setting.parse(raw)
    if fallback is not None and setting.kind == CHOICE:
        return setting.parse(str(fallback))
    return setting.default if fallback is None else fallback


@contextlib.contextmanager
def override(name: str, value: str) -> Iterator[None]:
    """Within the block, `get(name)` returns `value` in this thread (validated as the variable's
    text would be: EnvError naming the allowed values). One mechanism for every per-thread
    switch (simulation level, GEMM order), so none keeps its own thread-local."""
    parsed = SETTINGS[name].parse(str(value))
    local = _thread.__dict__.setdefault("values", {})
    missing = name not in local
    prev = local.get(name)
    local[name] = parsed
    try:
        yield
    finally:
        if missing:
            local.pop(name, None)
        else:
            local[name] = prev


NATIVE_CACHES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_native_caches() -> None:
    """Give torch's and oneDNN's shape-keyed primitive caches our bounds when the user set none.
    Why: each new input shape (a prompt length, a merged embedding batch) JIT-compiles a
    primitive that the caches keep, ~0.7 MB a shape (both caches) up to 1,024 each: a
    long-running server's RSS grew ~6 MB per 1,000 requests (docs/serving.md, Soak). Both
    libraries read the variables when a thread first uses them, so `xdna serve` (and the soak
    benchmark) call this before any op; `import torch_xdna` does not (installing the package
    leaves CPU-only programs as they were). A value the user set is checked and kept."""
    for name in NATIVE_CACHES:
        if read_raw(name) is None:
            os.environ[name] = str(SETTINGS[name].default)
        else:
            get(name)                    # a bad value fails here, naming the variable


def choices(name: str) -> tuple[str, ...]:
    """The allowed values of an enumerated setting (its one definition)."""
    return SETTINGS[name].choices()


def describe(include_internal: bool = True) -> list[dict]:
    """One row per setting for `xdna info --env`: name, kind, the value set now (raw text, None
    when unset, "<hidden>" for a secret), default, allowed values, unit, who reads it, doc."""
    rows = []
    for s in _TABLE:
        if s.internal and not include_internal:
            continue
        raw = read_raw(s.name)
        rows.append({"name": s.name, "kind": s.kind,
                     "value": "<hidden>" if s.secret and raw is not None else raw,
                     "default": s.default, "allowed": list(s.choices()), "unit": s.unit,
                     "reader": s.reader, "internal": s.internal, "doc": s.doc})
    return rows
