// Row softmax for AIE2P: out[r] = exp(x[r] - max) / sum, for `rows` rows of n bf16 values.
// Max and sum follow xdna_vec.h's lane order; the division is one reciprocal of the sum
// (aie::inv) and a multiply per element. Golden: golden.softmax (bit-exact); vector.OPS
// "softmax" (torch.softmax on the bf16 operands) within the bound in docs/kernels.md.
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

extern "C" void softmax_bf16_f32(const bfloat16 *in, float *out, int32 rows, int32 n) {
  xdna::set_numerics();
  for (int r = 0; r < rows; ++r) {
    const bfloat16 *x = in + r * n;
    float *y = out + r * n;
    const float m = xdna::row_max(x, n);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) {          // e = exp(x - m), kept in the output row
      vf e = xdna::exp_f32(aie::sub(xdna::load_f32(x, i, n), m));
      if (i + int(L) > n)                       // padded lanes must not add exp(0 - m)
        for (unsigned j = n - i; j < L; ++j) e.set(0.0f, j);
      xdna::store_part(y, i, n, e);
      acc = aie::add(acc, e);
    }
    const float inv = aie::inv(aie::reduce_add(acc));
    for (int i = 0; i < n; i += L) xdna::store_part(y, i, n, xdna::fmul(xdna::load_f32(y, i, n), inv));
  }
}
