// Row softmax for AIE2P in the array IR's form: out[r] = exp(x[r] - max) / sum, for `rows` rows
// of n values (one unit of VectorDesign "softmax", kernels/lower/vector.py).
//   softmax_<in>_<out>(x, out, [work f32* (bf16 in)], rows, n)
// Max and sum follow xdna_vec.h's lane order; the division is one reciprocal of the sum
// (aie::inv) and a multiply per element; exp is evaluated again in the last pass rather than
// kept in the output (a bf16 output would round it). Golden: golden.softmax (bit-exact);
// vector.OPS "softmax" (torch.softmax on the bf16 operands) within the bound in docs/kernels.md.
#include "xdna_row.h"

using xdna::L;
using xdna::vf;

template <typename TI, typename TO>
static void softmax_impl(const TI *in, TO *out, float *work, int32 rows, int32 n) {
  xdna::set_numerics();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < rows; ++r) {
    const xdna::Row<TI> x(in + r * n, work, n);
    TO *y = out + r * n;
    vf mx = aie::broadcast<float, L>(ninf);
    for (int i = 0; i < n; i += L) mx = aie::max(mx, x(i, ninf));
    const float m = aie::reduce_max(mx);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < n; i += L) {
      vf e = xdna::exp_f32(aie::sub(x(i), m));
      if (i + int(L) > n)                       // padded lanes must not add exp(0 - m)
        for (unsigned j = n - i; j < L; ++j) e.set(0.0f, j);
      acc = aie::add(acc, e);
    }
    const float inv = aie::inv(aie::reduce_add(acc));
    for (int i = 0; i < n; i += L)
      xdna::store_part(y, i, n, xdna::fmul(xdna::exp_f32(aie::sub(x(i), m)), inv));
  }
}

extern "C" {
void softmax_f32_f32(const float *x, float *out, int32 rows, int32 n) {
  softmax_impl(x, out, nullptr, rows, n);
}
void softmax_f32_bf16(const float *x, bfloat16 *out, int32 rows, int32 n) {
  softmax_impl(x, out, nullptr, rows, n);
}
void softmax_bf16_f32(const bfloat16 *x, float *out, float *work, int32 rows, int32 n) {
  softmax_impl(x, out, work, rows, n);
}
void softmax_bf16_bf16(const bfloat16 *x, bfloat16 *out, float *work, int32 rows, int32 n) {
  softmax_impl(x, out, work, rows, n);
}
}
