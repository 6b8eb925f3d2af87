"""A host kernel for the memory-bound GEMMs of decode (simulator speed): bf16 weights in,
fp32 out, few rows.

The array's GEMM numerics are bf16 operands with fp32 accumulation and an fp32 result. A decode
step multiplies 1 (or a batch of a few) rows by every weight, so on the host it is bound by the
bytes of weight it reads. The fp32 GEMM on bf16-valued fp32 copies of the weights (what the
references use for prefill, kernels/host/gemm.py) reads 4 bytes per weight; torch's own bf16
linear reads 2 but rounds the result to bf16 (not the design's fp32 result). This kernel reads
the bf16 weight as stored (2 bytes) and computes what the array computes: x [M, K] (fp32 holding
bf16 values) times w [N, K] bf16, each product exact in fp32 (8-bit x 8-bit significands), summed
by fp32 FMA in a fixed order per output element, fp32 result. The order (4 x 8-lane accumulators
over K in blocks of 32, even/odd elements in separate accumulators, combined pairwise, then the
K % 32 tail in sequence; the C source says it exactly) depends on K alone (a single row takes
the weight rows two at a time, each still in that order: the same bits):
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

import threading
import warnings

import torch

from torch_xdna.kernels.host import cc as host_cc

MAX_ROWS = 8                    # rows above this are compute bound: the fp32 BLAS GEMM wins
MIN_WEIGHT = 1 << 20            # weights below this many elements: the fp32 path is as fast
FAST_OPERAND = True             # operand(), rms_norm(): the C passes (False: torch ops; tests compare)
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

/* Two weight rows per pass, each in dot_bf16's order exactly (the same bits): the permuted x
   is loaded once for both rows (pinned in registers, else the compiler re-loads it from memory
   per FMA) and the row after the pair is prefetched at the position being read (a row ahead of
   the stream: the hardware prefetcher alone leaves ~30% of the read rate on this host). */
#define PIN(a) __asm__("" : "+x"(a))
static void dot2_bf16(const float* xp, const uint16_t* w0, int64_t k, float* y0, float* y1) {
  const uint16_t* w1 = w0 + k;
  const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
  __m256 b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    _mm_prefetch((const char*)(w1 + k + i), _MM_HINT_T0);
    __m256 x0 = _mm256_loadu_ps(xp + i), x1 = _mm256_loadu_ps(xp + i + 8);
    __m256 x2 = _mm256_loadu_ps(xp + i + 16), x3 = _mm256_loadu_ps(xp + i + 24);
    PIN(x0); PIN(x1); PIN(x2); PIN(x3);
    __m256i v0 = _mm256_loadu_si256((const __m256i*)(w0 + i));
    __m256i v1 = _mm256_loadu_si256((const __m256i*)(w0 + i + 16));
    __m256i u0 = _mm256_loadu_si256((const __m256i*)(w1 + i));
    __m256i u1 = _mm256_loadu_si256((const __m256i*)(w1 + i + 16));
    PIN(v0); PIN(v1); PIN(u0); PIN(u1);
    a0 = _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), a0);
    a1 = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(v0, hi)), a1);
    a2 = _mm256_fmadd_ps(x2, _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), a2);
    a3 = _mm256_fmadd_ps(x3, _mm256_castsi256_ps(_mm256_and_si256(v1, hi)), a3);
    b0 = _mm256_fmadd_ps(x0, _mm256_castsi256_ps(_mm256_slli_epi32(u0, 16)), b0);
    b1 = _mm256_fmadd_ps(x1, _mm256_castsi256_ps(_mm256_and_si256(u0, hi)), b1);
    b2 = _mm256_fmadd_ps(x2, _mm256_castsi256_ps(_mm256_slli_epi32(u1, 16)), b2);
    b3 = _mm256_fmadd_ps(x3, _mm256_castsi256_ps(_mm256_and_si256(u1, hi)), b3);
  }
  float r0 = finish(a0, a1, a2, a3), r1 = finish(b0, b1, b2, b3);
  for (; i < k; ++i) { r0 = fmaf(xp[i], bf16f(w0[i]), r0); r1 = fmaf(xp[i], bf16f(w1[i]), r1); }
  *y0 = r0;
  *y1 = r1;
}

/* numerics.operand of one fp32 (xdna_operand below says it) */
static inline float operand1(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  if ((r & 0x7F800000u) == 0) r &= 0x80000000u;
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) r = (b | 0x00400000u) & 0xFFFF0000u;
  memcpy(&f, &r, 4);
  return f;
}

/* x rounded to operands (idempotent: an operand stays itself) and permuted: per 16 elements
   [x0 x2 .. x14 | x1 x3 .. x15] (little-endian: the low bf16 of each 32-bit word is the even
   element); the K % 32 tail in place */
static void permute_x(const float* x, float* xp, int64_t k) {
  int64_t k32 = k - k % 32;
  for (int64_t i = 0; i < k32; i += 16)
    for (int t = 0; t < 8; ++t) {
      xp[i + t] = operand1(x[i + 2 * t]);
      xp[i + 8 + t] = operand1(x[i + 2 * t + 1]);
    }
  for (int64_t i = k32; i < k; ++i) xp[i] = operand1(x[i]);
}

/* y[r, j] = x[r, :] . w[j, :] for j in [n0, n1); x [m, k] fp32, w [n, k] bf16 bits, y [m, ldy];
   scratch: m * k floats for the permuted rows of x. */
void xdna_bf16_linear(const float* x, const uint16_t* w, float* y, int64_t m, int64_t k,
                      int64_t n0, int64_t n1, int64_t ldy, float* scratch) {
  for (int64_t r = 0; r < m; ++r) permute_x(x + r * k, scratch + r * k, k);
  int64_t j = n0;
  if (m == 1)                           /* decode: weight rows in pairs (dot2_bf16) */
    for (; j + 2 <= n1; j += 2) dot2_bf16(scratch, w + j * k, k, y + j, y + j + 1);
  for (; j < n1; ++j) {
    const uint16_t* wr = w + j * k;
    for (int64_t r = 0; r < m; ++r) y[r * ldy + j] = dot_bf16(scratch + r * k, wr, k);
  }
}

/* RMSNorm's elementwise tail, after torch's sum of squares ss [rows] (the reduction order is
   torch's; everything here is one IEEE operation per step, as llm_blocks._rms writes it):
   r = 1 / sqrt(ss / d + eps); y = (x * r) * (w + off) (w row i % wrows; `+ off` only when
   use_off); operand-rounded when round_out. */
void xdna_rms_tail(const float* x, const float* ss, const float* w, float* y, int64_t rows,
                   int64_t d, int64_t wrows, float eps, float off, int64_t use_off,
                   int64_t round_out) {
  const float n = (float)d;
  for (int64_t i = 0; i < rows; ++i) {
    const float r = 1.0f / sqrtf(ss[i] / n + eps);
    const float* wr = w + (i % wrows) * d;
    const float* xr = x + i * d;
    float* yr = y + i * d;
    for (int64_t j = 0; j < d; ++j) {
      const float wv = use_off ? wr[j] + off : wr[j];
      const float v = (xr[j] * r) * wv;
      yr[j] = round_out ? operand1(v) : v;
    }
  }
}

/* operand(x * cos + roll(x, d/2) * ssin) for x [n, h, d], cos / ssin [n, d] (llm_blocks._rope
   then the rounding: each product and the sum one IEEE operation, as the torch ops do) */
void xdna_rope(const float* x, const float* cos, const float* ssin, float* y, int64_t n,
               int64_t h, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < h; ++i) {
      const float* xr = x + (t * h + i) * d;
      const float* c = cos + t * d;
      const float* sn = ssin + t * d;
      float* yr = y + (t * h + i) * d;
      for (int64_t j = 0; j < d; ++j) {
        const float rot = xr[j < half ? j + (d - half) : j - half];
        const float a = xr[j] * c[j];
        const float b = rot * sn[j];
        yr[j] = operand1(a + b);
      }
    }
}

/* numerics.operand of fp32 x in one pass: round to nearest even at bf16 (torch's rounding),
   flush a bf16 subnormal to a zero of its sign, widen back; a NaN stays a (quiet) NaN. */
void xdna_operand(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = operand1(x[i]);
}
"""

_lock = threading.Lock()
_state: dict[str, object] = {}


def _enabled() -> bool:
    return host_cc.enabled()


def _compile():
    """Compile and load the source (host_cc: private temp dir, nothing cached on disk)."""
    so = host_cc.compile_library(_SOURCE, "gemv")
    fn = host_cc.void_fn(so, "xdna_bf16_linear", "p" * 3 + "i" * 5 + "p")
    _state["operand"] = host_cc.void_fn(so, "xdna_operand", "ppi")
    _state["rms"] = host_cc.void_fn(so, "xdna_rms_tail", "p" * 4 + "i" * 3 + "ff" + "ii")
    _state["rope"] = host_cc.void_fn(so, "xdna_rope", "p" * 4 + "i" * 3)
    return fn


def _build() -> bool:
    _state["fn"] = _compile()
    return True


def _warn(why: str) -> None:
    warnings.warn(f"torch_xdna: host decode kernel not built ({why}); decode "
                  "uses the fp32 GEMM path (slower, the same numerics up to fp32 summation "
                  "order). Install a C compiler, or set TORCH_XDNA_HOST_KERNELS=0 to "
                  "silence this", RuntimeWarning, stacklevel=4)


def available() -> bool:
    """True when the kernel is built and enabled (compiled on first call, ~1 s; build_once
    reads TORCH_XDNA_HOST_KERNELS)."""
    return host_cc.build_once(_state, _lock, _build, on_error=_warn)


def unavailable_reason() -> str:
    return host_cc.unavailable_reason(_state, available())


def use_for(rows: int, w: torch.Tensor) -> bool:
    """Whether a [rows, K] x w [N, K] product takes this kernel (few rows, a large weight)."""
    return fits(rows, w) and available()


def fits(rows: int, w: torch.Tensor) -> bool:
    """use_for without the availability check, for callers that made it once per block."""
    return rows <= MAX_ROWS and w.numel() >= MIN_WEIGHT


def bf16_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """operand(x) [M, K] fp32 @ w [N, K] bf16 ^T -> fp32 [M, N] (module docstring): the kernel
    rounds x to operands itself (numerics.operand, bit-equal; an operand x is unchanged).
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


def operand(x: torch.Tensor) -> torch.Tensor:
    """numerics.operand(x) (RNE to bf16, subnormals flushed, held in fp32) of a contiguous fp32
    tensor in one C pass instead of 4 torch ops (sim speed: a decode layer rounds ~12 small
    activations). Bit-equal to numerics.operand (tests/test_host_gemv.py), NaN aside (a NaN
    stays a NaN, payload not kept). Other tensors, or before the kernel is built:
    numerics.operand. The caller checks available() (TORCH_XDNA_HOST_KERNELS), once per block
    rather than per call (an environment read costs as much as the rounding here)."""
    from torch_xdna.kernels import numerics
    op = _state.get("operand") if FAST_OPERAND else None
    if op is None or x.dtype != torch.float32 or not x.is_contiguous():
        return numerics.operand(x)
    y = torch.empty_like(x)
    op(x.data_ptr(), y.data_ptr(), x.numel())
    return y


def _pool(nt: int):
    return host_cc.thread_pool(_state, nt, "xdna-gemv")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float,
             round_out: bool) -> torch.Tensor | None:
    """llm_blocks._rms on an operand x [..., D] with its operand weight w [..., D] (w's rows
    repeat over x's leading rows): torch's sum of squares (its reduction order: mean is that sum
    divided by D), then one C pass for the elementwise rest (eps, 1/sqrt, the two products,
    the weight offset, the optional rounding), bit-equal to the torch ops (sim speed: ~5 ops
    less per norm). None when the kernel is not built or the layout does not fit (contiguous
    fp32): the caller runs the torch ops."""
    fn = _state.get("rms") if FAST_OPERAND else None
    d = x.shape[-1]
    if (fn is None or x.dtype != torch.float32 or w.dtype != torch.float32 or not d
            or not x.is_contiguous() or not w.is_contiguous() or w.shape[-1] != d):
        return None
    rows, wrows = x.numel() // d, w.numel() // d
    if not wrows or rows % wrows:
        return None
    ss = (x * x).sum(-1)
    y = torch.empty_like(x)
    fn(x.data_ptr(), ss.data_ptr(), w.data_ptr(), y.data_ptr(), rows, d, wrows, eps, offset,
       1 if offset else 0, 1 if round_out else 0)
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor | None:
    """operand(llm_blocks._rope(x, cos, signed_sin)) in one C pass (bit-equal: the same two
    products and sum per element, then the rounding; sim speed: 5 ops less per layer) for
    x [n, H, D] and cos / signed_sin [n, 1, D], contiguous fp32. None otherwise (the caller
    runs the torch ops)."""
    fn = _state.get("rope") if FAST_OPERAND else None
    if fn is None or x.dim() != 3 or x.dtype != torch.float32 or not x.is_contiguous():
        return None
    n, h, d = x.shape
    if (cos.shape != (n, 1, d) or signed_sin.shape != (n, 1, d) or not cos.is_contiguous()
            or not signed_sin.is_contiguous() or cos.dtype != torch.float32
            or signed_sin.dtype != torch.float32):
        return None
    y = torch.empty_like(x)
    fn(x.data_ptr(), cos.data_ptr(), signed_sin.data_ptr(), y.data_ptr(), n, h, d)
    return y
