// LayerNorm over the last axis for AIE2P: y = (x - mean) * invsqrt(var + eps) * w + b, for
// `rows` rows of n bf16 values, bf16 weight and bias of n, fp32 out. mean = sum / n and
// var = sum((x - mean)^2) / n (two passes, the biased variance as torch), lane order of
// xdna_vec.h. Golden: golden.layer_norm (bit-exact); vector.OPS "layer_norm" within the bound.
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

extern "C" void layer_norm_bf16_f32(const bfloat16 *in, const bfloat16 *w, const bfloat16 *b,
                                    float *out, int32 rows, int32 n, float eps) {
  xdna::set_numerics();
  for (int r = 0; r < rows; ++r) {
    const bfloat16 *x = in + r * n;
    float *y = out + r * n;
    const float mean = xdna::row_sum(x, n) / float(n);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) {
      vf d = aie::sub(xdna::load_f32(x, i, n), mean);
      if (i + int(L) > n)
        for (unsigned j = n - i; j < L; ++j) d.set(0.0f, j);
      acc = aie::add(acc, xdna::fmul(d, d));
    }
    const float var = aie::reduce_add(acc) / float(n);
    const float rstd = aie::invsqrt(var + eps);
    for (int i = 0; i < n; i += L) {
      vf d = xdna::fmul(aie::sub(xdna::load_f32(x, i, n), mean), rstd);
      vf o = aie::add(xdna::fmul(d, xdna::load_f32(w, i, n)), xdna::load_f32(b, i, n));
      xdna::store_part(y, i, n, o);
    }
  }
}
