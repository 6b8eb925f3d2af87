"""A host kernel for the memory-bound GEMMs of decode (simulator speed): bf16 weights in,
fp32 out, few rows.

The array's GEMM numerics are bf16 operands with fp32 accumulation and an fp32 result. A decode
step multiplies 1 (or a batch of a few) rows by every weight, so on the host it is bound by the
bytes of weight it reads. The fp32 GEMM on bf16-valued fp32 copies of the weights (what the
references use for prefill, kernels/host_gemm.py) reads 4 bytes per weight; torch's own bf16
linear reads 2 but rounds the result to bf16 (not the design's fp32 result). This kernel reads
the bf16 weight as stored (2 bytes) and computes what the array computes: x [M, K] (fp32 holding
bf16 values) times w [N, K] bf16, each product exact in fp32 (8-bit x 8-bit significands), summed
by fp32 FMA in a fixed order per output element, fp32 result. The order (4 x 8-lane accumulators
over K in blocks of 32, even/odd elements in separate accumulators, combined pairwise, then the
K % 32 tail in sequence; the C source says it exactly) depends on K alone:
no dependence on M, on the other rows or on the thread count (threads split N), so a row's result
is batch invariant. It differs from a BLAS order only in how the fp32 sum is associated (bounded
by K * 2^-24 * sum|x||w| per element).

Compiled once per process from the C source below (a plain C compiler, ~1 s; AVX2+FMA hosts)
into a private temp directory and loaded with ctypes; no library is cached on disk (a cached
.so would be code another writer of the cache could replace). Where it cannot be built or the
host lacks AVX2, `available()` is False and callers keep the fp32 path.
TORCH_XDNA_HOST_KERNELS=0 disables it.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

MAX_ROWS = 8                    # rows above this are compute bound: the fp32 BLAS GEMM wins
MIN_WEIGHT = 1 << 20            # weights below this many elements: the fp32 path is as fast
_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

/* The fixed order (host_gemv.py): K in blocks of 32; block element 2t of each 16-element half
   goes to lane t of one accumulator, element 2t+1 to lane t of another (4 x 8-lane fp32 FMA
   accumulators), the accumulators and lanes combined pairwise; then the K % 32 tail in
   sequence. The even/odd split lets a 256-bit load of 16 bf16 widen with a shift and a mask
   (no shuffles); x is permuted to match once per call. */
static inline float finish(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float l[8];
  _mm256_storeu_ps(l, s);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static inline float bf16f(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* xp: x permuted by permute_x; w: bf16 bits */
static float dot_bf16(const float* xp, const uint16_t* w, int64_t k) {
  const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256i v0 = _mm256_loadu_si256((const __m256i*)(w + i));
    __m256i v1 = _mm256_loadu_si256((const __m256i*)(w + i + 16));
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i), _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 8), _mm256_castsi256_ps(_mm256_and_si256(v0, hi)), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 16), _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 24), _mm256_castsi256_ps(_mm256_and_si256(v1, hi)), a3);
  }
  float r = finish(a0, a1, a2, a3);
  for (; i < k; ++i) r = fmaf(xp[i], bf16f(w[i]), r);
  return r;
}

/* per 16 elements: [x0 x2 .. x14 | x1 x3 .. x15] (little-endian: the low bf16 of each 32-bit
   word is the even element); the K % 32 tail unchanged */
static void permute_x(const float* x, float* xp, int64_t k) {
  int64_t k32 = k - k % 32;
  for (int64_t i = 0; i < k32; i += 16)
    for (int t = 0; t < 8; ++t) { xp[i + t] = x[i + 2 * t]; xp[i + 8 + t] = x[i + 2 * t + 1]; }
  for (int64_t i = k32; i < k; ++i) xp[i] = x[i];
}

/* int8 / int4 codes with one fp32 (bf16-valued) scale per group of g (g % 32 == 0, k % 32 == 0):
   each weight is dequantized as the core does, code * scale (exact in fp32: <= 8 x 8 significant
   bits), rounded to bf16 (RNE), then used in dot_bf16's order, so the result equals dot_bf16 on
   the dequantized bf16 weight bit for bit. */
static inline __m256 deq(__m256i code, __m256 scale) {
  __m256i b = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(code), scale));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  b = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  return _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32((int)0xFFFF0000u)));
}

static float dot_i8(const float* xp, const int8_t* q, const float* sc, int64_t k, int64_t g) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 32) {
    __m256 s = _mm256_set1_ps(sc[i / g]);
    __m256i v0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(q + i)));
    __m256i v1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(q + i + 16)));
    /* int16 pairs in 32-bit lanes: the even element is the low half */
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i), deq(_mm256_srai_epi32(_mm256_slli_epi32(v0, 16), 16), s), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 8), deq(_mm256_srai_epi32(v0, 16), s), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 16), deq(_mm256_srai_epi32(_mm256_slli_epi32(v1, 16), 16), s), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 24), deq(_mm256_srai_epi32(v1, 16), s), a3);
  }
  return finish(a0, a1, a2, a3);
}

/* int4: byte j holds element 2j (low nibble) and 2j + 1 (high nibble), two's complement */
static inline __m256i nib(__m256i v) {
  const __m256i eight = _mm256_set1_epi32(8);
  return _mm256_sub_epi32(_mm256_xor_si256(v, eight), eight);
}

static float dot_i4(const float* xp, const uint8_t* q, const float* sc, int64_t k, int64_t g) {
  const __m256i lo4 = _mm256_set1_epi32(0xF);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 32) {
    __m256 s = _mm256_set1_ps(sc[i / g]);
    __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + i / 2)));
    __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(q + i / 2 + 8)));
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i), deq(nib(_mm256_and_si256(b0, lo4)), s), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 8), deq(nib(_mm256_srli_epi32(b0, 4)), s), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 16), deq(nib(_mm256_and_si256(b1, lo4)), s), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + i + 24), deq(nib(_mm256_srli_epi32(b1, 4)), s), a3);
  }
  return finish(a0, a1, a2, a3);
}

/* bits: 8 (int8 codes [n, k]) or 4 (packed [n, k / 2]); sc: fp32 scales [n, k / g] */
void xdna_quant_linear(const float* x, const void* q, const float* sc, float* y, int64_t m,
                       int64_t k, int64_t g, int64_t bits, int64_t n0, int64_t n1, int64_t ldy,
                       float* scratch) {
  for (int64_t r = 0; r < m; ++r) permute_x(x + r * k, scratch + r * k, k);
  const int64_t ng = k / g;
  for (int64_t j = n0; j < n1; ++j)
    for (int64_t r = 0; r < m; ++r)
      y[r * ldy + j] = bits == 8
          ? dot_i8(scratch + r * k, (const int8_t*)q + j * k, sc + j * ng, k, g)
          : dot_i4(scratch + r * k, (const uint8_t*)q + j * (k / 2), sc + j * ng, k, g);
}

/* y[r, j] = x[r, :] . w[j, :] for j in [n0, n1); x [m, k] fp32, w [n, k] bf16 bits, y [m, ldy];
   scratch: m * k floats for the permuted rows of x. */
void xdna_bf16_linear(const float* x, const uint16_t* w, float* y, int64_t m, int64_t k,
                      int64_t n0, int64_t n1, int64_t ldy, float* scratch) {
  for (int64_t r = 0; r < m; ++r) permute_x(x + r * k, scratch + r * k, k);
  for (int64_t j = n0; j < n1; ++j) {
    const uint16_t* wr = w + j * k;
    for (int64_t r = 0; r < m; ++r) y[r * ldy + j] = dot_bf16(scratch + r * k, wr, k);
  }
}
"""

_lock = threading.Lock()
_state: dict[str, object] = {}


def _enabled() -> bool:
    v = os.environ.get("TORCH_XDNA_HOST_KERNELS", "1").strip().lower()
    return v not in ("0", "off", "false", "no")


def _compile():
    """Compile the source into a private temp dir (0700) and load it; nothing is cached on disk,
    so no library is ever loaded from a location another user could have written."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    with tempfile.TemporaryDirectory(prefix="xdna-gemv-") as d:
        src, lib = os.path.join(d, "gemv.c"), os.path.join(d, "gemv.so")
        with open(src, "w") as f:
            f.write(_SOURCE)
        r = subprocess.run([cc, "-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC",
                            "-o", lib, src], capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"{cc} failed: {r.stderr.strip().splitlines()[-1:]}")
        so = ctypes.CDLL(lib)                  # mapped: the file may go with the directory
    fn = so.xdna_bf16_linear
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 5 + [ctypes.c_void_p]
    qfn = so.xdna_quant_linear
    qfn.restype = None
    qfn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 7 + [ctypes.c_void_p]
    return fn, qfn


def _build() -> bool:
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        _state["why"] = f"host CPU capability {cap} (the kernel needs AVX2 + FMA)"
        return False
    try:
        _state["fn"], _state["qfn"] = _compile()
        return True
    except Exception as e:                       # no compiler: keep the fp32 path
        _state["why"] = f"{type(e).__name__}: {e}"
        warnings.warn(f"torch_xdna: host decode kernel not built ({_state['why']}); decode "
                      "uses the fp32 GEMM path (slower, the same numerics up to fp32 summation "
                      "order). Install a C compiler, or set TORCH_XDNA_HOST_KERNELS=0 to "
                      "silence this", RuntimeWarning, stacklevel=3)
        return False


def available() -> bool:
    """True when the kernel is built and enabled (compiled on first call, ~1 s)."""
    if not _enabled():
        return False
    ok = _state.get("ok")
    if ok is None:
        with _lock:
            ok = _state.get("ok")
            if ok is None:
                ok = _state["ok"] = _build()
    return bool(ok)


def unavailable_reason() -> str:
    return "" if available() else str(_state.get("why", "disabled (TORCH_XDNA_HOST_KERNELS=0)"))


def use_for(rows: int, w: torch.Tensor) -> bool:
    """Whether a [rows, K] x w [N, K] product takes this kernel (few rows, a large weight)."""
    return rows <= MAX_ROWS and w.numel() >= MIN_WEIGHT and available()


def bf16_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 (bf16 values) @ w [N, K] bf16 ^T -> fp32 [M, N] (module docstring).
    With torch.get_num_threads() > 1 the N range is split over that many threads (the call
    releases the GIL); every element's order is the same either way."""
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"bf16_linear: x [M, K] and w [N, K], got {tuple(x.shape)} and "
                         f"{tuple(w.shape)}")
    if x.dtype != torch.float32 or w.dtype != torch.bfloat16:
        raise TypeError(f"bf16_linear: x fp32 and w bf16, got {x.dtype} and {w.dtype}")
    fn = _state["fn"]
    x, w = x.contiguous(), w.contiguous()
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty(m, n)
    scratch = torch.empty(max(m * k, 8))
    args = (x.data_ptr(), w.data_ptr(), y.data_ptr(), m, k)
    nt = min(torch.get_num_threads(), max(1, n // 256))
    if nt <= 1:
        fn(*args, 0, n, n, scratch.data_ptr())
        return y
    pool = _pool(nt)
    step = -(-n // nt)
    scratches = [scratch] + [torch.empty(max(m * k, 8)) for _ in range(nt - 1)]
    futs = [pool.submit(fn, *args, j, min(n, j + step), n, scratches[t].data_ptr())
            for t, j in enumerate(range(0, n, step))]
    for f in futs:
        f.result()
    return y


def quant_supported(precision: str, k: int, group: int) -> bool:
    """Whether quant_linear takes int8/int4 weights of reduction size k in groups of `group`."""
    return precision in ("int8", "int4") and group > 0 and group % 32 == 0 and k % group == 0


def quant_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, precision: str,
                 group: int) -> torch.Tensor:
    """x [M, K] fp32 (bf16 values) @ dequant(q, scales)^T -> fp32 [M, N], reading the int8 codes
    (int8 [N, K]) or packed int4 (uint8 [N, K / 2]) as stored: each weight dequantized to bf16 as
    the core does (code * scale, RNE), then bf16_linear's order, so the result equals
    bf16_linear(x, dequantized bf16 weight) bit for bit at 1 (int8) or 0.5 (int4) bytes/weight."""
    m, k = x.shape
    bits = 8 if precision == "int8" else 4
    if not quant_supported(precision, k, group) or q.shape[1] * (8 // bits) != k:
        raise ValueError(f"quant_linear: {precision} weight {tuple(q.shape)} with group {group} "
                         f"for K={k}; needs a group that is a multiple of 32 dividing K")
    n = q.shape[0]
    x, q = x.contiguous(), q.contiguous()
    sc = scales.float().contiguous()
    y = torch.empty(m, n)
    qfn = _state["qfn"]
    args = (x.data_ptr(), q.data_ptr(), sc.data_ptr(), y.data_ptr(), m, k, group, bits)
    nt = min(torch.get_num_threads(), max(1, n // 256))
    scratches = [torch.empty(max(m * k, 8)) for _ in range(max(1, nt))]   # alive for the calls
    if nt <= 1:
        qfn(*args, 0, n, n, scratches[0].data_ptr())
        return y
    step = -(-n // nt)
    futs = [_pool(nt).submit(qfn, *args, j, min(n, j + step), n, scratches[t].data_ptr())
            for t, j in enumerate(range(0, n, step))]
    for f in futs:
        f.result()
    return y


def _pool(nt: int) -> ThreadPoolExecutor:
    pool = _state.get("pool")
    if pool is None or _state.get("pool_n") != nt:
        pool = _state["pool"] = ThreadPoolExecutor(nt, thread_name_prefix="xdna-gemv")
        _state["pool_n"] = nt
    return pool
