"""Fused elementwise host kernels for the encoder's GEMM epilogues (simulator speed): the
bias add, the exact-erf GELU and the rounding of the result to the next GEMM's operand in one
pass over the accumulator, bit for bit what the torch ops compute.

The unfused reference (encoder_blocks.linear_rows then numerics.gemm_operand) runs 9 passes over
an [R, I] fp32 tensor: acc + b; torch.mul(a, 1/sqrt 2); erf_; add_(1); mul_(0.5); mul_(t); to
bf16 (RNE); hardshrink (flush subnormals to +0); back to fp32. This kernel does the same
operations per element in the same order: the adds and multiplies are single IEEE fp32
operations (compiled with -ffp-contract=off, so no fused multiply-add changes a rounding); erf
is the very function torch's erf_ calls on this build, MKL's vmsErf with VML_HA |
VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE (aten/src/ATen/cpu/vml.h, IMPLEMENT_VML_MKL), looked up in
libtorch_cpu.so and called on blocks of a row (an elementwise function: its result does not
depend on the block, tests/test_host_fused.py checks); the fp32 -> bf16 rounding is ATen's
(round to nearest even, NaN -> 0xFFFF as its AVX2 conversion writes it), then every bf16 with a
zero exponent field (subnormals, -0) becomes +0 (hardshrink at the largest subnormal).

Where the build has no vmsErf symbol (a torch without MKL), the host lacks AVX2, no C compiler
is found or TORCH_XDNA_HOST_KERNELS=0, `available()` is False and callers keep the torch ops.
Rows are independent (a row's bits never depend on the other rows), so splitting rows over
threads (torch.get_num_threads()) changes nothing.
"""
from __future__ import annotations

import math
import threading

import torch

from torch_xdna.kernels import numerics

from torch_xdna.kernels.host import cc as host_cc

# VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE (mkl_vml_defines.h), the mode ATen's vml.h passes
VML_MODE = 0x2 | 0x00140000 | 0x100
ACTS = ("none", "gelu")
_SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef void (*erf_fn)(int n, const float* a, float* r, long long mode);
#define BLK 512

/* numerics.gemm_operand of one fp32 value: ATen's RNE to bf16 (NaN -> 0xFFFF), a zero
   exponent field (subnormal or -0) -> +0, back to fp32 */
static inline float operand_of(float y) {
  uint32_t u, r;
  memcpy(&u, &y, 4);
  if (y != y) r = 0xFFFFu;
  else r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  if ((r & 0x7F80u) == 0) r = 0;
  r <<= 16;
  float o;
  memcpy(&o, &r, 4);
  return o;
}

/* out[r, j] = operand(act(acc[r, j] + bias[j])) for rows [0, rows); act 1 = exact GELU as
   activations.apply_epilogue_ writes it: a * 0.5 * (erf(a * c) + 1), c = fp32(1/sqrt 2).
   acc row stride lda; out [rows, n] (may be acc when lda == n). */
void xdna_bias_act_operand(const float* acc, int64_t lda, const float* bias, float* out,
                           int64_t rows, int64_t n, int64_t act, float c, erf_fn erf,
                           int64_t mode) {
  float a[BLK], u[BLK];
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = acc + r * lda;
    float* orow = out + r * n;
    for (int64_t j0 = 0; j0 < n; j0 += BLK) {
      int64_t m = n - j0 < BLK ? n - j0 : BLK;
      if (!act) {
        for (int64_t j = 0; j < m; ++j) orow[j0 + j] = operand_of(ar[j0 + j] + bias[j0 + j]);
        continue;
      }
      for (int64_t j = 0; j < m; ++j) { a[j] = ar[j0 + j] + bias[j0 + j]; u[j] = a[j] * c; }
      erf((int)m, u, u, (long long)mode);
      for (int64_t j = 0; j < m; ++j) orow[j0 + j] = operand_of((a[j] * 0.5f) * (u[j] + 1.0f));
    }
  }
}

/* operand(acc[r, j] + bias[j]) as bias_act_operand (act none) computes it, written head-major:
   column j = b * d + c of row r goes to out[b * block + r * d + c] (the [3, heads, R, d] layout
   attention reads Q, K, V in); `out` points at this call's first row. */
void xdna_bias_operand_heads(const float* acc, int64_t lda, const float* bias, float* out,
                             int64_t rows, int64_t n, int64_t d, int64_t block) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = acc + r * lda;
    for (int64_t b = 0; b * d < n; ++b) {
      float* o = out + b * block + r * d;
      for (int64_t c = 0; c < d; ++c) o[c] = operand_of(ar[b * d + c] + bias[b * d + c]);
    }
  }
}

/* numerics.operand(acc[r, j] + bias[j] + res[r, j]) (the adds in that order, each one fp32
   rounding): ATen's RNE to bf16 (NaN -> 0xFFFF), a zero exponent field -> a zero of the same
   sign (operand_bf16's flush keeps the sign), back to fp32. The layer norm's input after a
   GEMM with bias and residual. Row strides lda (acc), ldr (res); out [rows, n] may be acc. */
void xdna_bias_res_operand(const float* acc, int64_t lda, const float* bias, const float* res,
                           int64_t ldr, float* out, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* ar = acc + r * lda;
    const float* rr = res + r * ldr;
    float* orow = out + r * n;
    for (int64_t j = 0; j < n; ++j) {
      float y = (ar[j] + bias[j]) + rr[j];
      uint32_t u, q;
      memcpy(&u, &y, 4);
      if (y != y) q = 0xFFFFu;
      else q = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
      if ((q & 0x7F80u) == 0) q &= 0x8000u;
      q <<= 16;
      memcpy(&orow[j], &q, 4);
    }
  }
}

/* numerics.operand_nonneg(torch.nan_to_num_(p, nan=0)) in place, for softmax probabilities:
   NaN -> 0, +-inf -> +-FLT_MAX (nan_to_num), ATen's RNE to bf16, then threshold_ at the
   largest bf16 subnormal (a value <= it becomes +0), back to fp32 */
void xdna_probs_operand(float* p, int64_t n, float thr) {
  for (int64_t i = 0; i < n; ++i) {
    float x = p[i];
    uint32_t u, r;
    if (x != x) x = 0.0f;
    else if (x > 3.40282347e38f) x = 3.40282347e38f;
    else if (x < -3.40282347e38f) x = -3.40282347e38f;
    memcpy(&u, &x, 4);
    r = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
    float y;
    memcpy(&y, &r, 4);
    p[i] = y > thr ? y : 0.0f;
  }
}
"""

_lock = threading.Lock()
_state: dict[str, object] = {}


def _build() -> bool:
    """Compile and load the passes (host_cc.build_once: CPU check, failures keep the torch ops)."""
    _state["erf"] = host_cc.torch_symbol("vmsErf", "torch built without MKL")
    lib = host_cc.compile_library(_SOURCE, "fused")
    _state["probs"] = host_cc.void_fn(lib, "xdna_probs_operand", "pif")
    _state["res"] = host_cc.void_fn(lib, "xdna_bias_res_operand", "pippipii")
    _state["heads"] = host_cc.void_fn(lib, "xdna_bias_operand_heads", "pipp" + "i" * 4)
    _state["fn"] = host_cc.void_fn(lib, "xdna_bias_act_operand", "pipp" + "i" * 3 + "fpi")
    return True


def available() -> bool:
    """True when the kernel is built and enabled (compiled on first call, ~1 s)."""
    return host_cc.enabled() and host_cc.build_once(_state, _lock, _build)


def unavailable_reason() -> str:
    return host_cc.unavailable_reason(_state, available())


def bias_act_operand(acc: torch.Tensor, bias: torch.Tensor, act: str = "none") -> torch.Tensor:
    """numerics.gemm_operand(apply_epilogue_(act, acc + bias)) for an fp32 accumulator
    acc [R, N] (rows may be strided) and an fp32 bias [N], in one pass, written in place
    into `acc` when it is contiguous. Call only when available()."""
    if act not in ACTS:
        raise ValueError(f"bias_act_operand: act {act!r} not fused; use one of {ACTS}")
    if acc.dtype != torch.float32 or acc.dim() != 2 or acc.stride(1) != 1:
        raise ValueError(f"bias_act_operand: acc must be fp32 [R, N] with unit column stride, "
                         f"got {acc.dtype} {tuple(acc.shape)} strides {acc.stride()}")
    rows, n = acc.shape
    bias = bias.to(torch.float32).contiguous()
    if bias.shape != (n,):
        raise ValueError(f"bias_act_operand: bias [{n}] expected, got {tuple(bias.shape)}")
    out = acc if acc.is_contiguous() else torch.empty(rows, n)
    if not available():
        raise RuntimeError(f"host_fused kernel unavailable ({unavailable_reason()}); use the "
                           "torch ops (encoder_blocks.linear_rows does)")
    fn, erf = _state["fn"], _state["erf"]
    c = 1.0 / math.sqrt(2.0)                      # as torch.mul casts the Python scalar: fp32
    a = 1 if act == "gelu" else 0
    nt = min(torch.get_num_threads(), max(1, rows // 16))
    if nt <= 1:
        fn(acc.data_ptr(), acc.stride(0), bias.data_ptr(), out.data_ptr(), rows, n, a, c, erf,
           VML_MODE)
        return out
    step = -(-rows // nt)
    futs = [_pool(nt).submit(fn, acc[r:].data_ptr(), acc.stride(0), bias.data_ptr(),
                             out[r:].data_ptr(), min(step, rows - r), n, a, c, erf, VML_MODE)
            for r in range(0, rows, step)]
    for f in futs:
        f.result()
    return out


def _pool(nt: int):
    return host_cc.thread_pool(_state, nt, "xdna-fused")


def probs_operand_(p: torch.Tensor) -> torch.Tensor:
    """numerics.operand_nonneg(torch.nan_to_num_(p, nan=0.0)) in place on a contiguous fp32
    tensor (softmax probabilities before the P V product), in one pass instead of four.
    Call only when available()."""
    if p.dtype != torch.float32 or not p.is_contiguous():
        raise ValueError(f"probs_operand_: p must be contiguous fp32, got {p.dtype} "
                         f"{tuple(p.shape)} strides {p.stride()}")
    if not available():
        raise RuntimeError(f"host_fused kernel unavailable ({unavailable_reason()}); use "
                           "numerics.operand_nonneg(torch.nan_to_num_(p, nan=0.0))")
    _state["probs"](p.data_ptr(), p.numel(), numerics.BF16_MAX_SUBNORMAL)
    return p


def bias_residual_operand(acc: torch.Tensor, bias: torch.Tensor,
                          residual: torch.Tensor) -> torch.Tensor:
    """numerics.operand(acc + bias + residual) (fp32 acc [R, N] and residual [R, N] with unit
    column stride, bias [N]) in one pass, written into `acc` when it is contiguous: a layer
    norm's rounded input after the GEMM's bias and the residual add. Call only when
    available()."""
    for name, t in (("acc", acc), ("residual", residual)):
        if t.dtype != torch.float32 or t.dim() != 2 or t.stride(1) != 1:
            raise ValueError(f"bias_residual_operand: {name} must be fp32 [R, N] with unit "
                             f"column stride, got {t.dtype} {tuple(t.shape)} {t.stride()}")
    rows, n = acc.shape
    bias = bias.to(torch.float32).contiguous()
    if residual.shape != acc.shape or bias.shape != (n,):
        raise ValueError(f"bias_residual_operand: residual {tuple(residual.shape)} and bias "
                         f"{tuple(bias.shape)} do not match acc {tuple(acc.shape)}")
    if not available():
        raise RuntimeError(f"host_fused kernel unavailable ({unavailable_reason()}); use "
                           "numerics.operand(acc + bias + residual)")
    out = acc if acc.is_contiguous() else torch.empty(rows, n)
    _state["res"](acc.data_ptr(), acc.stride(0), bias.data_ptr(), residual.data_ptr(),
                  residual.stride(0), out.data_ptr(), rows, n)
    return out


def gemm_operand(x: torch.Tensor) -> torch.Tensor:
    """numerics.gemm_operand(x) for fp32 x [R, N] (unit column stride) in one pass into a new
    tensor: the bias pass with a zero bias (x + 0 is x, but -0 + 0 = +0, and gemm_operand
    flushes -0 to +0 anyway). Call only when available()."""
    n = x.shape[-1]
    zeros = _state.get("zeros")
    if zeros is None or zeros.numel() < n:
        with _lock:
            zeros = _state["zeros"] = torch.zeros(max(n, 4096))
    out = torch.empty(x.shape)
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"gemm_operand: x must be fp32 [R, N] with unit column stride, got "
                         f"{x.dtype} {tuple(x.shape)} strides {x.stride()}")
    if not available():
        raise RuntimeError(f"host_fused kernel unavailable ({unavailable_reason()}); use "
                           "numerics.gemm_operand")
    _state["fn"](x.data_ptr(), x.stride(0), zeros.data_ptr(), out.data_ptr(), x.shape[0], n, 0,
                 0.0, _state["erf"], VML_MODE)
    return out


def bias_operand_heads(acc: torch.Tensor, bias: torch.Tensor, head_dim: int) -> torch.Tensor:
    """bias_act_operand(acc, bias, "none") laid out head-major: acc [R, N] (unit column
    stride), N = blocks x head_dim, gives [blocks, R, head_dim] (for QKV: [3 * heads, R, D]),
    in one pass instead of the pass and a permuting copy. Call only when available()."""
    rows, n = acc.shape
    if acc.dtype != torch.float32 or acc.stride(1) != 1 or head_dim <= 0 or n % head_dim:
        raise ValueError(f"bias_operand_heads: acc must be fp32 [R, N] with unit column stride "
                         f"and N a multiple of head_dim {head_dim}, got {acc.dtype} "
                         f"{tuple(acc.shape)} strides {acc.stride()}")
    bias = bias.to(torch.float32).contiguous()
    if bias.shape != (n,):
        raise ValueError(f"bias_operand_heads: bias [{n}] expected, got {tuple(bias.shape)}")
    if not available():
        raise RuntimeError(f"host_fused kernel unavailable ({unavailable_reason()}); use "
                           "bias_act_operand's torch ops and a permuting copy")
    out = torch.empty(n // head_dim, rows, head_dim)
    fn, block = _state["heads"], rows * head_dim
    nt = min(torch.get_num_threads(), max(1, rows // 16))
    step = -(-rows // nt)
    if nt <= 1:
        fn(acc.data_ptr(), acc.stride(0), bias.data_ptr(), out.data_ptr(), rows, n, head_dim,
           block)
        return out
    futs = [_pool(nt).submit(fn, acc[r:].data_ptr(), acc.stride(0), bias.data_ptr(),
                             out[:, r:].data_ptr(), min(step, rows - r), n, head_dim, block)
            for r in range(0, rows, step)]
    for f in futs:
        f.result()
    return out
