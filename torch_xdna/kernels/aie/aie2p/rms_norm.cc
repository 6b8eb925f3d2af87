// RMSNorm over the last axis for AIE2P in the array IR's form: y = x * invsqrt(mean(x^2) + eps)
// [* (w + offset)], for `rows` rows of n values, weight of n in the input's dtype (offset 1.0 for Gemma-style
// weights; one unit of VectorDesign "rms_norm").
//   rms_norm_<in>_<out>(x, w, out, [work], rows, n, eps, offset)     with weight
//   rms_norm_nw_<in>_<out>(x, out, [work], rows, n, eps, offset)     without (offset unused)
// ([work]: f32* fp32 working row, bf16 inputs only.) Golden: golden.rms_norm (bit-exact);
// llm_blocks._rms / vector.OPS "rms_norm" within the bound in docs/kernels.md.
#include "xdna_row.h"

using xdna::L;
using xdna::vf;

template <typename TI, typename TO>
static void rms_norm_impl(const TI *in, const TI *w, TO *out, float *work, int32 rows,
                          int32 n, float eps, float offset) {
  xdna::set_numerics();
  for (int r = 0; r < rows; ++r) {
    const xdna::Row<TI> x(in + r * n, work, n);
    TO *y = out + r * n;
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) {
      vf v = x(i);
      acc = aie::add(acc, xdna::fmul(v, v));
    }
    const float rstd = aie::invsqrt(aie::reduce_add(acc) / float(n) + eps);
    for (int i = 0; i < n; i += L) {
      vf o = xdna::fmul(x(i), rstd);
      if (w) o = xdna::fmul(o, aie::add(xdna::load_operand(w, i, n), offset));
      xdna::store_part(y, i, n, o);
    }
  }
}

#define XDNA_RMS(ti, tn, to, on)                                                                   \
  void rms_norm_##tn##_##on(const ti *x, const ti *w, to *out XDNA_WORK_##tn, int32 rows,    \
                            int32 n, float eps, float offset) {                                    \
    rms_norm_impl(x, w, out, XDNA_WORKV_##tn, rows, n, eps, offset);                               \
  }                                                                                                \
  void rms_norm_nw_##tn##_##on(const ti *x, to *out XDNA_WORK_##tn, int32 rows, int32 n,           \
                               float eps, float offset) {                                          \
    rms_norm_impl(x, (const ti *)nullptr, out, XDNA_WORKV_##tn, rows, n, eps, offset);       \
  }
#define XDNA_WORK_f32
#define XDNA_WORKV_f32 nullptr
#define XDNA_WORK_bf16 , float *work
#define XDNA_WORKV_bf16 work

extern "C" {
XDNA_RMS(float, f32, float, f32)
XDNA_RMS(float, f32, bfloat16, bf16)
XDNA_RMS(bfloat16, bf16, float, f32)
XDNA_RMS(bfloat16, bf16, bfloat16, bf16)
}
