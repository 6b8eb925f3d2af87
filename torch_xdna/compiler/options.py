"""Compile options: what `torch.compile(..., backend="xdna", options={...})` may set.

Dynamo passes `options` to a custom backend as a keyword argument; `CompileOptions.from_dict`
validates it so a typo fails at compile time with the list of known keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from torch_xdna.kernels.numerics_plan import NumericsPlan
from torch_xdna.runtime.cachedir import cache_root

FALLBACK_MODES = ("warn", "error", "silent")
COMPILER_DTYPES = ("bf16", "bfp16")      # GEMM numerics the compiler lowers today


def default_cache_dir() -> Path:
    """The cache root (runtime/cachedir.py: $TORCH_XDNA_CACHE_DIR or ~/.cache/torch_xdna)."""
    return cache_root()


class FallbackRefused(NotImplementedError):
    """Graph nodes have no NPU lowering and the fallback policy is 'error'."""


@dataclass(frozen=True)
class CompileOptions:
    """fallback: policy for graph nodes with no NPU kernel (None: TORCH_XDNA_FALLBACK).
    precision: NumericsPlan (or its text form) for GEMM sites. cache: use the on-disk compile
    cache in cache_dir. min_partition_size: a partition with fewer compute nodes and no
    GEMM/attention/embedding runs on the host (a tiny elementwise partition costs a dispatch and
    two transfers for little work). fuse: fusion on (off: one launch per op, for comparison)."""

    fallback: str | None = None
    precision: NumericsPlan = field(default_factory=NumericsPlan)
    cache: bool = True
    cache_dir: Path = field(default_factory=default_cache_dir)
    min_partition_size: int = 2
    fuse: bool = True

    def __post_init__(self):
        if self.fallback is not None and self.fallback not in FALLBACK_MODES:
            raise ValueError(f"xdna compile option fallback={self.fallback!r}: use one of "
                             f"{FALLBACK_MODES} (or leave it unset for TORCH_XDNA_FALLBACK)")
        if isinstance(self.precision, str):
            object.__setattr__(self, "precision", NumericsPlan.parse(self.precision))
        for _, num in list(self.precision.rules) + [("default", self.precision.default)]:
            if num.dtype not in COMPILER_DTYPES:
                raise ValueError(f"xdna compile option precision: {num.dtype} is not lowered by "
                                 f"the compiler yet (supported: {COMPILER_DTYPES}); quantized "
                                 f"weights are served by the engine (xdna quantize)")
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        if self.min_partition_size < 1:
            raise ValueError("xdna compile option min_partition_size must be >= 1")

    def fallback_mode(self) -> str:
        from torch_xdna.device import fallback
        return self.fallback or fallback.mode()

    def cache_key_part(self) -> str:
        """The options that change the lowered plan (part of the cache key)."""
        return f"precision={self.precision};min={self.min_partition_size};fuse={self.fuse}"

    @classmethod
    def from_dict(cls, opts: dict | None) -> "CompileOptions":
        opts = dict(opts or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise ValueError(f"xdna compile options {unknown} are not known; use: {sorted(known)}")
        return replace(cls(), **opts)
