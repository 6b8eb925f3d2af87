"""A host kernel for decode attention (simulator speed): attention.flash_attention's closed form
in one C pass instead of ~17 small torch ops per layer.

Case: the attention block's decode path (llm_blocks.attend with the fp32 KV mirror, `valid`
given): at most MAX_ROWS query rows per KV head (GQA groups stacked), fp32 tile-padded K/V,
causal, optional sliding window; no softcap (those calls keep the torch reference). It computes
the SAME values as flash_attention step for step: per key S = (q . k) * scale in fp32, masked
keys -inf; per tile the running max m_t (reset at each split_ranges boundary); e = exp(S - m_t);
P = bf16(e) rounded exactly as numerics.operand; per tile l_t = sum e and PV_t = sum P v; the
tiles scaled to the final max by w_t = exp(m_t - max_t m_t) (0 for a tile that saw no key);
O = sum PV_t w_t, l = sum l_t w_t, result O * (1/l) (zeros when l == 0). exp is the very
function torch.exp runs on this build (MKL VML vmsExp, HA mode, taken from libtorch_cpu by
dlsym; `_build` checks it bit for bit against torch.exp and refuses the kernel otherwise).
The only differences from the torch reference are how fp32 sums are associated: the q . k dot
over D (products of two bf16 values are exact), the sums over a tile and over tiles. A q . k
that rounds one ulp apart can move e by an ulp and so flip a bf16 rounding of P (2^-8
relative on one term); tests/test_host_attention.py states the bounds.

Compiled with the GEMV kernel's recipe (host_cc); TORCH_XDNA_HOST_KERNELS=0 or ENABLED = False
keeps the torch reference.
"""
from __future__ import annotations

import ctypes
import threading

import torch

from torch_xdna.kernels.host import cc as host_cc

MAX_ROWS = 8                     # query rows per KV head (decode: the GQA group, a few tokens)
ENABLED = True                   # tests compare with the torch reference
# torch's vml::vexp on an MKL build: vmsExp(n, a, r, VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE)
_VML_MODE = 0x2 | 0x140000 | 0x100

_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <math.h>

typedef void (*vexp_fn)(const int32_t* n, const float* a, float* r, const int64_t* mode);

static inline float hsum8(__m256 s) {
  float l[8];
  _mm256_storeu_ps(l, s);
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* q . k: products of bf16 values are exact, so FMA adds them with one rounding each */
static float dot(const float* a, const float* b, int64_t d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= d; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float r = hsum8(_mm256_add_ps(s0, s1));
  for (; i < d; ++i) r = fmaf(a[i], b[i], r);
  return r;
}

/* numerics.operand of a finite non-negative fp32 (RNE to bf16, a bf16 subnormal flushed) */
static inline float operand_pos(float f) {
  union { float f; uint32_t u; } c = {f};
  uint32_t r = (c.u + 0x7FFFu + ((c.u >> 16) & 1u)) & 0xFFFF0000u;
  if ((r & 0x7F800000u) == 0) r &= 0x80000000u;
  c.u = r;
  return c.f;
}

static void vexp(void* fp, float* a, float* r, int64_t n) {
  const int64_t mode = MODE;
  while (n > 0) {
    int32_t c = n > (1 << 30) ? (1 << 30) : (int32_t)n;
    ((vexp_fn)fp)(&c, a, r, &mode);
    a += c; r += c; n -= c;
  }
}

/* q [H, R, D] contiguous; k, v: H heads of T*tkv keys x D (row stride D, head strides kh, vh),
   key index j at absolute position k0 + j, keys j >= s_len padding; qpos [R]; per: tiles per
   split (split_ranges); scratch x, e: H*R*T*tkv floats; run, w: H*R*T floats; out [H, R, D]. */
void xdna_decode_attention(const float* q, const float* k, const float* v, float* out,
                           int64_t H, int64_t R, int64_t D, int64_t kh, int64_t vh,
                           int64_t tkv, int64_t T, int64_t s_len, const int64_t* qpos,
                           int64_t k0, int64_t causal, int64_t window, int64_t per, float scale,
                           void* expfn, float* x, float* e, float* run, float* w, float* pv) {
  const int64_t total = T * tkv;
  const float ninf = -INFINITY;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t row = h * R + r;
      const float* qr = q + row * D;
      const float* kr = k + h * kh;
      float* xs = x + row * total;
      float* rr = run + row * T;
      int64_t jlo = 0, jhi = s_len;                 /* visible keys [jlo, jhi) */
      if (causal && qpos[r] - k0 + 1 < jhi) jhi = qpos[r] - k0 + 1;
      if (window && qpos[r] - window - k0 + 1 > jlo) jlo = qpos[r] - window - k0 + 1;
      if (jhi < jlo) jhi = jlo;
      float m = ninf;
      for (int64_t t = 0; t < T; ++t) {
        if (t % per == 0) m = ninf;
        float tmax = ninf;
        for (int64_t j = t * tkv; j < (t + 1) * tkv; ++j) {
          float s = ninf;
          if (j >= jlo && j < jhi) s = dot(qr, kr + j * D, D) * scale;
          xs[j] = s;
          if (s > tmax) tmax = s;
        }
        if (tmax > m) m = tmax;
        rr[t] = m;
        const float sub = m == ninf ? 0.0f : m;
        for (int64_t j = t * tkv; j < (t + 1) * tkv; ++j) xs[j] = xs[j] - sub;
      }
      float mf = ninf;
      for (int64_t t = 0; t < T; ++t) if (rr[t] > mf) mf = rr[t];
      for (int64_t t = 0; t < T; ++t) w[row * T + t] = rr[t] - mf;
    }
  vexp(expfn, x, e, H * R * total);
  vexp(expfn, w, w, H * R * T);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t r = 0; r < R; ++r) {
      const int64_t row = h * R + r;
      const float* es = e + row * total;
      const float* vr = v + h * vh;
      float* o = out + row * D;
      for (int64_t i = 0; i < D; ++i) o[i] = 0.0f;
      float l = 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        if (run[row * T + t] == ninf) continue;     /* w = 0: nothing seen yet */
        const float wt = w[row * T + t];
        float ls = 0.0f;
        for (int64_t i = 0; i < D; ++i) pv[i] = 0.0f;
        for (int64_t j = t * tkv; j < (t + 1) * tkv; ++j) {
          const float ej = es[j];
          ls += ej;
          if (ej == 0.0f) continue;                 /* masked or underflowed: P = 0 */
          const float p = operand_pos(ej);
          if (p == 0.0f) continue;
          const __m256 pb = _mm256_set1_ps(p);
          const float* vj = vr + j * D;
          int64_t i = 0;
          for (; i + 8 <= D; i += 8)
            _mm256_storeu_ps(pv + i, _mm256_fmadd_ps(pb, _mm256_loadu_ps(vj + i),
                                                     _mm256_loadu_ps(pv + i)));
          for (; i < D; ++i) pv[i] = fmaf(p, vj[i], pv[i]);
        }
        l = l + ls * wt;
        for (int64_t i = 0; i < D; ++i) o[i] = o[i] + pv[i] * wt;
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      for (int64_t i = 0; i < D; ++i) o[i] = o[i] * inv;
    }
}
"""

_lock = threading.Lock()
_state: dict[str, object] = {}


def _torch_vexp() -> int:
    """Address of the exp torch.exp runs on fp32 CPU tensors here (MKL VML vmsExp, exported
    by libtorch_cpu as its Fortran entry VMSEXP_); RuntimeError when this build has none."""
    return host_cc.torch_symbol("VMSEXP_", "torch.exp is not MKL's here")


def _check_exp(fn_exp: int) -> None:
    """The dlsym'd exp must be torch.exp bit for bit (random bit patterns, the decode range,
    every tail length); else the kernel would not compute flash_attention's values."""
    f = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_int64))(fn_exp)
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 16,), generator=g).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.rand(1 << 16, generator=g) * -104,
                   torch.tensor([0.0, -0.0, float("-inf"), -87.3, -88.7, -103.9, -104.0])])
    for n in (x.numel(), 1, 7, 9, 17, 33):
        xs = x[:n].contiguous()
        y = torch.empty_like(xs)
        f(ctypes.byref(ctypes.c_int32(n)), xs.data_ptr(), y.data_ptr(),
          ctypes.byref(ctypes.c_int64(_VML_MODE)))
        r = torch.exp(xs)
        same = (r.view(torch.int32) == y.view(torch.int32)) | (torch.isnan(r) & torch.isnan(y))
        if not bool(same.all()):
            raise RuntimeError("MKL vmsExp differs from torch.exp on this build")


def _build() -> bool:
    """Check torch's exp, compile and load (host_cc.build_once: CPU check; a failure keeps the
    torch reference)."""
    fexp = _torch_vexp()
    _check_exp(fexp)
    so = host_cc.compile_library(_SOURCE.replace("MODE", hex(_VML_MODE)), "attention")
    fn = host_cc.void_fn(so, "xdna_decode_attention",
                         "p" * 4 + "i" * 8 + "p" + "i" * 4 + "f" + "p" * 6)
    _state["fn"], _state["exp"], _state["so"] = fn, fexp, so
    return True


def available() -> bool:
    """True when the kernel is built and enabled (compiled on first call, ~1 s)."""
    return ENABLED and host_cc.build_once(_state, _lock, _build)


def unavailable_reason() -> str:
    return host_cc.unavailable_reason(_state, available()) if ENABLED else "ENABLED is False"


def use_for(rows: int, valid: int | None, softcap: float | None, exact: bool) -> bool:
    """Whether a flash_attention call takes this kernel: few rows, the fp32 tile-padded K/V
    (`valid`), no softcap, not the fp32 verification mode. Call once per block (the
    TORCH_XDNA_HOST_KERNELS read is not free: a built kernel is taken without re-reading it,
    the caller gates on the host kernels being on)."""
    return (rows <= MAX_ROWS and valid is not None and not softcap and not exact and ENABLED
            and (_state.get("ok") is True or available()))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                     tkv: int, splits: int, q_offset, k_offset: int, valid: int,
                     window: int | None) -> torch.Tensor:
    """flash_attention(q, k, v, scale=, tkv=, splits=, causal=True, q_offset=, k_offset=,
    window=, valid=, q_rounded=True) (module docstring): q [Hkv, R, D] fp32 operands,
    k / v [Hkv, T*tkv, D] fp32 tile-padded (rows contiguous, k_offset a multiple of tkv)
    -> fp32 [Hkv, R, D]."""
    hkv, r, d = q.shape
    total = k.shape[1]
    if (k_offset % tkv or total % tkv or total < valid or v.shape != k.shape
            or k.dtype != torch.float32 or v.dtype != torch.float32
            or k.stride()[1:] != (d, 1) or v.stride()[1:] != (d, 1)):
        raise ValueError(f"decode_attention: fp32 K/V [Hkv, T*{tkv}, {d}] with contiguous rows "
                         f"at a tile-aligned k_offset, got {tuple(k.shape)} {k.dtype} "
                         f"strides {k.stride()} at k_offset {k_offset}")
    q = q.contiguous()
    n_tiles = total // tkv
    per = -(-max(n_tiles, 1) // max(1, splits))
    if isinstance(q_offset, torch.Tensor):
        qpos = q_offset.to(torch.int64).contiguous()
    else:
        qpos = torch.full((r,), int(q_offset), dtype=torch.int64)
    out = torch.empty(hkv, r, d)
    buf = torch.empty(2 * hkv * r * total + 2 * hkv * r * n_tiles + d)
    n1, n2 = hkv * r * total, hkv * r * n_tiles
    p = buf.data_ptr()
    _state["fn"](q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), hkv, r, d,
                 k.stride(0), v.stride(0), tkv, n_tiles, valid, qpos.data_ptr(), k_offset, 1,
                 window or 0, per, scale, _state["exp"], p, p + 4 * n1, p + 8 * n1,
                 p + 8 * n1 + 4 * n2, p + 8 * n1 + 8 * n2)
    return out
