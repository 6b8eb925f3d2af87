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

Pre-packed weights: oneDNN's fp32 inner product on a weight reordered once into its blocked
layout (`pack`, kept per resident weight by the caller's operand cache) ran the encoder's GEMM
shapes 5-15% faster than MKL's sgemm on this AVX2 host (measured, all-MiniLM-L6-v2 shapes,
M 500-3500; docs/serving.md). It sums K in another order than sgemm (same fp32 accumulation
bound) and is used only where the same row-invariance probe passes for it (`packed_invariant`);
without mkldnn, with TORCH_XDNA_HOST_KERNELS=0 or when the probe fails, `pack` gives None and
gemm_rows keeps torch.mm.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.host import cc as host_cc

MIN_ROWS = 16                        # row counts below this are padded up (MKL: < 4 differs)
_PROBE_ROWS = (16, 17, 23, 32, 33, 64, 100, 129, 256, 500, 1000)
_PROBE_OFFSETS = (0, 1, 7)
_INVARIANT: dict[tuple[int, int, int], bool] = {}
_PACKED_INVARIANT: dict[tuple[int, int, int], bool] = {}
PACK_ROWS_HINT = 1024                # the M oneDNN picks the packed layout for (the bench's
                                     # batches run 400-3700 rows; 1024 measured best of M, 1024)


def _probe(k: int, n: int, packed: bool = False) -> bool:
    g = torch.Generator().manual_seed(k * 131 + n)
    m = max(_PROBE_ROWS) + max(_PROBE_OFFSETS)
    x = torch.randn(m, k, generator=g).bfloat16().float()
    w = (torch.randn(k, n, generator=g) / k ** 0.5).bfloat16().float()
    if packed:
        pw = _reorder(w)
        mm = lambda a: _packed_mm(a, pw)               # noqa: E731
    else:
        mm = lambda a: torch.mm(a, w)                  # noqa: E731
    full = mm(x)
    return all(torch.equal(mm(x[o:o + r]), full[o:o + r])
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


def packing_enabled() -> bool:
    """mkldnn is in this torch build and TORCH_XDNA_HOST_KERNELS does not turn it off."""
    return host_cc.enabled() and torch.backends.mkldnn.is_available()


def _reorder(wo: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(wo.t().contiguous(), PACK_ROWS_HINT)


def _packed_mm(xo: torch.Tensor, pw: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(xo, pw, None, "none", [], "")


def packed_invariant(k: int, n: int) -> bool:
    """rows_invariant for the oneDNN packed-weight GEMM (probed once per shape and threads)."""
    key = (k, n, torch.get_num_threads())
    ok = _PACKED_INVARIANT.get(key)
    if ok is None:
        try:
            with torch.inference_mode():
                ok = _probe(k, n, packed=True)
        except RuntimeError:                            # this build's mkldnn op refused it
            ok = False
        _PACKED_INVARIANT[key] = ok
    return ok


def pack(wo: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed form of an operand weight wo [K, N] (fp32, bf16 values) for gemm_rows,
    or None where the packed GEMM is unavailable, disabled or not row-invariant on this host.
    Pack once per resident weight (it copies the weight into oneDNN's blocked layout)."""
    k, n = wo.shape
    if not (packing_enabled() and packed_invariant(k, n)):
        return None
    return _reorder(wo.float())


def gemm_rows(xo: torch.Tensor, wo: torch.Tensor,
              packed: torch.Tensor | None = None) -> torch.Tensor:
    """xo [M, K] @ wo [K, N] (operands already bf16-valued fp32) with each row's result
    independent of the other rows: one host fp32 GEMM where `rows_invariant` holds (the oneDNN
    packed one when `packed`, pack(wo), is given), else an fp64 GEMM rounded to fp32 (see the
    module docstring)."""
    m, k = xo.shape
    if packed is not None and packing_enabled():
        mm = lambda a: _packed_mm(a, packed)           # noqa: E731
    elif rows_invariant(k, wo.shape[1]):
        mm = lambda a: torch.mm(a, wo)                 # noqa: E731
    else:
        return torch.mm(xo.double(), wo.double()).float()
    if m >= MIN_ROWS:
        return mm(xo)
    pad = xo.new_zeros(MIN_ROWS, k)
    pad[:m] = xo
    return mm(pad)[:m]
