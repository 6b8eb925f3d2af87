// Shared vector helpers of the torch-xdna AIE2P core kernels (fp32 math on the vector unit).
//
// Rows are processed in 16-lane fp32 chunks; a partial last chunk is padded with a neutral
// value (0 for sums, -inf for max) so every lane follows the same accumulation order. The
// goldens in torch_xdna/kernels/aie/golden.py follow exactly these orders.
#pragma once

#include <aie_api/aie.hpp>

#include <limits>
#include <type_traits>

// Loop hints: Chess keywords; nothing for Peano and the host build.
#if defined(__chess__)
#define XDNA_PIPELINE chess_prepare_for_pipelining
#else
#define XDNA_PIPELINE
#endif

namespace xdna {

constexpr unsigned L = 16;                     // fp32 lanes of a 512-bit vector
using vf = aie::vector<float, L>;
using vb = aie::vector<bfloat16, L>;

// The project's operand rounding: round to nearest even (numerics.py); the core's reset mode is
// floor, so every kernel entry point sets it.
inline void set_numerics() { aie::set_rounding(aie::rounding_mode::conv_even); }

inline vf to_f32(const vb &x) { return aie::accum<accfloat, L>(x).to_vector<float>(); }
inline vb to_bf16(const vf &x) { return aie::accum<accfloat, L>(x).to_vector<bfloat16>(); }
// fmul: fp32 x fp32, which AIE2P computes by aie_api's FP32 emulation (bf16 partial products;
// emu/aie_api mul, golden.fmul). bmul: operands that hold bf16 values multiplied as bf16 x bf16
// -> fp32, the native multiply, exact (like the matmuls): no emulation.
inline vf fmul(const vf &a, const vf &b) { return aie::mul(a, b).to_vector<float>(); }
inline vf bmul(const vf &a, const vf &b) { return aie::mul(to_bf16(a), to_bf16(b)).to_vector<float>(); }
inline vf fmul(const vf &a, float b) { return aie::mul(a, b).to_vector<float>(); }

// Elements [i, i + 16) of p (n valid in total) as fp32, lanes past n set to `pad`. Rows of any
// length start anywhere, so these accesses are element-aligned (load_unaligned_v).
template <typename T>
inline vf load_f32(const T *p, int i, int n, float pad = 0.0f) {
  if (i + int(L) <= n) {
    if constexpr (std::is_same_v<T, float>) return aie::load_unaligned_v<L>(p + i);
    else return to_f32(aie::load_unaligned_v<L>(p + i));
  }
  vf v = aie::broadcast<float, L>(pad);
  for (int j = 0; i + j < n; ++j) v.set(float(p[i + j]), j);
  return v;
}
template <typename T>
inline void store_part(T *p, int i, int n, const vf &v) {
  if (i + int(L) <= n) {
    if constexpr (std::is_same_v<T, float>) aie::store_unaligned_v(p + i, v);
    else aie::store_unaligned_v(p + i, to_bf16(v));
    return;
  }
  for (int j = 0; i + j < n; ++j) p[i + j] = T(v[j]);
}

// exp(x) in fp32: Cody-Waite reduction x = n ln2 + r (ln2 split in two so n*C1 is exact), a
// degree-7 polynomial for e^r (Cephes expf coefficients), and 2^n applied as two exact power-of
// two factors. x > 88.72 gives +inf; x < -87.34 (result below the normal range) gives 0.
inline vf exp_f32(const vf &x) {
  const float hi = 88.72283935546875f, lo = -87.33654022216797f;
  const float magic = 12582912.0f;              // 1.5 * 2^23: (t + magic) - magic = rint(t)
  vf xc = aie::min(aie::max(x, lo), hi);
  vf t = fmul(xc, 1.44269502162933349609375f);
  vf n = aie::sub(aie::add(t, magic), magic);
  vf r = aie::sub(aie::sub(xc, fmul(n, 0.693359375f)), fmul(n, -2.12194440e-4f));
  vf p = aie::broadcast<float, L>(1.9875691500e-4f);
  p = aie::add(fmul(p, r), 1.3981999507e-3f);
  p = aie::add(fmul(p, r), 8.3334519073e-3f);
  p = aie::add(fmul(p, r), 4.1665795894e-2f);
  p = aie::add(fmul(p, r), 1.6666665459e-1f);
  p = aie::add(fmul(p, r), 5.0000001201e-1f);
  vf y = aie::add(aie::add(fmul(p, fmul(r, r)), r), 1.0f);
  aie::vector<int32, L> ni = aie::to_fixed<int32>(n, 0);
  aie::vector<int32, L> n1 = aie::downshift(ni, 1);
  aie::vector<int32, L> n2 = aie::sub(ni, n1);
  vf s1 = aie::vector_cast<float>(aie::upshift(aie::add(n1, int32(127)), 23));
  vf s2 = aie::vector_cast<float>(aie::upshift(aie::add(n2, int32(127)), 23));
  y = fmul(fmul(y, s1), s2);
  y = aie::select(y, std::numeric_limits<float>::infinity(), aie::gt(x, hi));
  return aie::select(y, 0.0f, aie::lt(x, lo));
}

// sigmoid(x) = 1 / (1 + exp(-x))
inline vf sigmoid_f32(const vf &x) { return aie::inv(aie::add(exp_f32(aie::neg(x)), 1.0f)); }

// tanh: odd polynomial for |x| < 0.625 (Cephes tanhf), else sign(x) (1 - 2 / (exp(2|x|) + 1)).
inline vf tanh_f32(const vf &x) {
  vf a = aie::abs(x);
  vf z = fmul(x, x);
  vf p = aie::broadcast<float, L>(-5.70498872745e-3f);
  p = aie::add(fmul(p, z), 2.06390887954e-2f);
  p = aie::add(fmul(p, z), -5.37397155531e-2f);
  p = aie::add(fmul(p, z), 1.33314422036e-1f);
  p = aie::add(fmul(p, z), -3.33332819422e-1f);
  vf small = aie::add(fmul(fmul(p, z), x), x);
  vf e = exp_f32(aie::add(a, a));
  vf big = aie::sub(aie::broadcast<float, L>(1.0f), fmul(aie::inv(aie::add(e, 1.0f)), 2.0f));
  big = aie::select(big, aie::neg(big), aie::lt(x, 0.0f));
  return aie::select(big, small, aie::lt(a, 0.625f));
}

// erf(z) ~ 1 - t (a1 + t (a2 + ...)) exp(-z^2), t = 1 / (1 + p |z|), sign restored
// (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7).
inline vf erf_f32(const vf &z) {
  vf a = aie::abs(z);
  vf t = aie::inv(aie::add(fmul(a, 0.3275911f), 1.0f));
  vf p = aie::broadcast<float, L>(1.061405429f);
  p = aie::add(fmul(p, t), -1.453152027f);
  p = aie::add(fmul(p, t), 1.421413741f);
  p = aie::add(fmul(p, t), -0.284496736f);
  p = aie::add(fmul(p, t), 0.254829592f);
  vf e = exp_f32(aie::neg(fmul(a, a)));
  vf y = aie::sub(aie::broadcast<float, L>(1.0f), fmul(fmul(p, t), e));
  return aie::select(y, aie::neg(y), aie::lt(z, 0.0f));
}

// gelu(x) = 0.5 x (1 + erf(x / sqrt 2))
inline vf gelu_f32(const vf &x) {
  vf e = erf_f32(fmul(x, 0.70710678118654752f));
  return fmul(fmul(x, 0.5f), aie::add(e, 1.0f));
}

// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
inline vf gelu_tanh_f32(const vf &x) {
  vf x3 = fmul(fmul(x, x), x);
  vf inner = fmul(aie::add(x, fmul(x3, 0.044715f)), 0.79788456080286536f);
  return fmul(fmul(x, 0.5f), aie::add(tanh_f32(inner), 1.0f));
}

// silu(x) = x sigmoid(x)
inline vf silu_f32(const vf &x) { return fmul(x, sigmoid_f32(x)); }

// Sum / max of a row of n values: lanes accumulate chunk by chunk, then reduce pairwise.
template <typename T>
inline float row_sum(const T *p, int n) {
  vf acc = aie::zeros<float, L>();
  for (int i = 0; i < n; i += L) acc = aie::add(acc, load_f32(p, i, n));
  return aie::reduce_add(acc);
}
template <typename T>
inline float row_max(const T *p, int n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  vf acc = aie::broadcast<float, L>(ninf);
  for (int i = 0; i < n; i += L) acc = aie::max(acc, load_f32(p, i, n, ninf));
  return aie::reduce_max(acc);
}

}  // namespace xdna

// The epilogue activations of the store / epilogue kernels (aie.STORE_ACTS), as X(name, expr of
// the fp32 vector x): each kernel source expands its entry points once per activation.
#define XDNA_ACTIVATIONS(X)                                                                       \
  X(none, x)                                                                                       \
  X(relu, aie::max(x, 0.0f))                                                                       \
  X(gelu, xdna::gelu_f32(x))                                                                       \
  X(gelu_tanh, xdna::gelu_tanh_f32(x))                                                             \
  X(silu, xdna::silu_f32(x))                                                                       \
  X(tanh, xdna::tanh_f32(x))                                                                       \
  X(sigmoid, xdna::sigmoid_f32(x))
