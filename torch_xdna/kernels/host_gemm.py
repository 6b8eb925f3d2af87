"""When the host's own GEMM may stand in for the array's, row by row (simulator speed).

The array's GEMM numerics are bf16 operands with fp32 accumulation. A bf16 x bf16 product is exact
in fp32, so a host fp32 GEMM on bf16-valued operands (held in fp32) computes the same thing up to
the order of the fp32 accumulation over K (bounded by K * 2^-23 * sum|x||w|). On an AVX2 host
torch's native bf16 matmul is ~20x slower than its fp32 GEMM (no bf16 FMA; it converts), so the
fp32 GEMM on bf16 values is the native path here.

Batch invariance: a row's result must not depend on which other rows share the GEMM (the array
computes each output tile on its own; a sentence's vector must not depend on its batch partners).
Host BLAS pick kernels by shape: MKL's sgemm, for example, takes another path below 4 rows, and
that path sums in another order. `rows_invariant(k, n)` says, by probing this host's GEMM once per
(K, N, threads), whether one [M, K] x [K, N] GEMM gives every row the bits it gets in any other
M >= MIN_ROWS (at any row offset). Where it does, `gemm_rows` runs one GEMM over all rows (padded
up to MIN_ROWS); where it does not, it accumulates in fp64 and rounds to fp32 (a row's bits then
depend on the other rows only through a double-rounding tie, ~2^-29 per element; about 2x slower).
"""
from __future__ import annotations

import torch

MIN_ROWS = 16                        # row counts below this are padded up (MKL: < 4 differs)
_PROBE_ROWS = (16, 17, 23, 32, 33, 64, 100, 129, 256, 500, 1000)
_PROBE_OFFSETS = (0, 1, 7)
_INVARIANT: dict[tuple[int, int, int], bool] = {}


def _probe(k: int, n: int) -> bool:
    g = torch.Generator().manual_seed(k * 131 + n)
    m = max(_PROBE_ROWS) + max(_PROBE_OFFSETS)
    x = torch.randn(m, k, generator=g).bfloat16().float()
    w = (torch.randn(k, n, generator=g) / k ** 0.5).bfloat16().float()
    full = torch.mm(x, w)
    return all(torch.equal(torch.mm(x[o:o + r], w), full[o:o + r])
               for r in _PROBE_ROWS for o in _PROBE_OFFSETS)


def rows_invariant(k: int, n: int) -> bool:
    """True when this host's fp32 GEMM [M, K] x [K, N] gives each row the same bits for every
    M >= MIN_ROWS and row offset (probed once per shape and thread count)."""
    key = (k, n, torch.get_num_threads())
    ok = _INVARIANT.get(key)
    if ok is None:
        with torch.inference_mode():
            ok = _INVARIANT[key] = _probe(k, n)
    return ok


def gemm_rows(xo: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    """xo [M, K] @ wo [K, N] (operands already bf16-valued fp32) with each row's result
    independent of the other rows: one host fp32 GEMM where `rows_invariant` holds, else an fp64
    GEMM rounded to fp32 (see the module docstring)."""
    m, k = xo.shape
    if not rows_invariant(k, wo.shape[1]):
        return torch.mm(xo.double(), wo.double()).float()
    if m >= MIN_ROWS:
        return torch.mm(xo, wo)
    pad = xo.new_zeros(MIN_ROWS, k)
    pad[:m] = xo
    return torch.mm(pad, wo)[:m]
