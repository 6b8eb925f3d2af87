// RMSNorm over the last axis for AIE2P: y = x * invsqrt(mean(x^2) + eps) * (w + offset), for
// `rows` rows of n bf16 values, bf16 weight of n, fp32 out (offset 1.0 for Gemma-style
// weights). Golden: golden.rms_norm (bit-exact); llm_blocks._rms / vector.OPS "rms_norm" within
// the bound in docs/kernels.md.
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

extern "C" void rms_norm_bf16_f32(const bfloat16 *in, const bfloat16 *w, float *out, int32 rows,
                                  int32 n, float eps, float offset) {
  xdna::set_numerics();
  for (int r = 0; r < rows; ++r) {
    const bfloat16 *x = in + r * n;
    float *y = out + r * n;
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) {
      vf v = xdna::load_f32(x, i, n);
      acc = aie::add(acc, xdna::fmul(v, v));
    }
    const float rstd = aie::invsqrt(aie::reduce_add(acc) / float(n) + eps);
    for (int i = 0; i < n; i += L) {
      vf g = aie::add(xdna::load_f32(w, i, n), offset);
      xdna::store_part(y, i, n, xdna::fmul(xdna::fmul(xdna::load_f32(x, i, n), rstd), g));
    }
  }
}
