// LayerNorm over the last axis for AIE2P in the array IR's form: y = (x - mean) *
// invsqrt(var + eps) [* w] [+ b], for `rows` rows of n values (one unit of VectorDesign
// "layer_norm"). The affine parameters arrive as the IR's one resident element: [w | b] (2n),
// [w] (n) or none, in the input's dtype (fp32 values
// seen as their bf16 operands).
//   layer_norm_<in>_<out>(x, wb, out, [work], rows, n, eps)      weight and bias
//   layer_norm_w_<in>_<out>(x, w, out, [work], rows, n, eps)     weight only
//   layer_norm_nw_<in>_<out>(x, out, [work], rows, n, eps)       neither
// ([work]: f32* fp32 working row, bf16 inputs only.) mean = sum / n and var = sum((x - mean)^2) / n
// (two passes, the biased variance as torch), lane order of xdna_vec.h. Golden: golden.layer_norm
// (bit-exact); vector.OPS "layer_norm" within the bound in docs/kernels.md.
#include "xdna_row.h"

using xdna::L;
using xdna::vf;

template <typename TI, typename TO>
static void layer_norm_impl(const TI *in, const TI *w, const TI *b, TO *out,
                            float *work, int32 rows, int32 n, float eps) {
  xdna::set_numerics();
  for (int r = 0; r < rows; ++r) {
    const xdna::Row<TI> x(in + r * n, work, n);
    TO *y = out + r * n;
    vf s = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) s = aie::add(s, x(i));
    const float mean = aie::reduce_add(s) / float(n);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) {
      vf d = aie::sub(x(i), mean);
      if (i + int(L) > n)
        for (unsigned j = n - i; j < L; ++j) d.set(0.0f, j);
      acc = aie::add(acc, xdna::fmul(d, d));
    }
    const float var = aie::reduce_add(acc) / float(n);
    const float rstd = aie::invsqrt(var + eps);
    for (int i = 0; i < n; i += L) {
      vf o = xdna::fmul(aie::sub(x(i), mean), rstd);
      if (w) o = xdna::fmul(o, xdna::load_operand(w, i, n));
      if (b) o = aie::add(o, xdna::load_operand(b, i, n));
      xdna::store_part(y, i, n, o);
    }
  }
}

#define XDNA_LN(ti, tn, to, on)                                                                    \
  void layer_norm_##tn##_##on(const ti *x, const ti *wb, to *out XDNA_WORK_##tn, int32 rows, \
                              int32 n, float eps) {                                                \
    layer_norm_impl(x, wb, wb + n, out, XDNA_WORKV_##tn, rows, n, eps);                            \
  }                                                                                                \
  void layer_norm_w_##tn##_##on(const ti *x, const ti *w, to *out XDNA_WORK_##tn,            \
                                int32 rows, int32 n, float eps) {                                  \
    layer_norm_impl(x, w, (const ti *)nullptr, out, XDNA_WORKV_##tn, rows, n, eps);          \
  }                                                                                                \
  void layer_norm_nw_##tn##_##on(const ti *x, to *out XDNA_WORK_##tn, int32 rows, int32 n,         \
                                 float eps) {                                                      \
    layer_norm_impl(x, (const ti *)nullptr, (const ti *)nullptr, out,                 \
                    XDNA_WORKV_##tn, rows, n, eps);                                                \
  }
#define XDNA_WORK_f32
#define XDNA_WORKV_f32 nullptr
#define XDNA_WORK_bf16 , float *work
#define XDNA_WORKV_bf16 work

extern "C" {
XDNA_LN(float, f32, float, f32)
XDNA_LN(float, f32, bfloat16, bf16)
XDNA_LN(bfloat16, bf16, float, f32)
XDNA_LN(bfloat16, bf16, bfloat16, bf16)
}
