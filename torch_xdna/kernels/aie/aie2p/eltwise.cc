// Elementwise vector kernels for AIE2P (the ops of vector.py / fused.py chains).
//
// Numerics (numerics.py): add/sub/max/min/neg/relu run on the fp32 path and take fp32 operands
// (exact up to the one IEEE rounding of add/sub); every other op takes bf16 operands and
// computes in fp32 (exp_f32 & co in xdna_vec.h); results are fp32. cast_f32_bf16 rounds to
// nearest even (what the array stores for a bf16 output). n is any count: the last partial
// vector is handled lane by lane.
// Goldens: golden.py (same fp32 operation order; bit-exact), and vector.OPS within the bounds
// docs/kernels.md states for the transcendental ones.
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

template <typename T, typename F>
static inline void unary(const T *__restrict in, float *__restrict out, int32 n, F f) {
  xdna::set_numerics();
  for (int i = 0; i < n; i += L) xdna::store_part(out, i, n, f(xdna::load_f32(in, i, n)));
}
template <typename T, typename F>
static inline void binary(const T *__restrict a, const T *__restrict b, float *__restrict out,
                          int32 n, F f) {
  xdna::set_numerics();
  for (int i = 0; i < n; i += L)
    xdna::store_part(out, i, n, f(xdna::load_f32(a, i, n), xdna::load_f32(b, i, n)));
}

extern "C" {

void add_f32(const float *a, const float *b, float *out, int32 n) {
  binary(a, b, out, n, [](vf x, vf y) { return aie::add(x, y); });
}
void sub_f32(const float *a, const float *b, float *out, int32 n) {
  binary(a, b, out, n, [](vf x, vf y) { return aie::sub(x, y); });
}
void max_f32(const float *a, const float *b, float *out, int32 n) {
  binary(a, b, out, n, [](vf x, vf y) { return aie::max(x, y); });
}
void min_f32(const float *a, const float *b, float *out, int32 n) {
  binary(a, b, out, n, [](vf x, vf y) { return aie::min(x, y); });
}
void neg_f32(const float *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return aie::neg(x); });
}
void relu_f32(const float *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return aie::max(x, 0.0f); });
}
void mul_bf16_f32(const bfloat16 *a, const bfloat16 *b, float *out, int32 n) {
  binary(a, b, out, n, [](vf x, vf y) { return xdna::bmul(x, y); });     // bf16 x bf16: exact
}
void div_bf16_f32(const bfloat16 *a, const bfloat16 *b, float *out, int32 n) {
  binary(a, b, out, n, [](vf x, vf y) { return xdna::fmul(x, aie::inv(y)); });  // x * (1/y)
}
void reciprocal_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return aie::inv(x); });
}
void sqrt_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return aie::sqrt(x); });
}
void rsqrt_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return aie::invsqrt(x); });
}
void square_bf16_f32(const bfloat16 *in, float *out, int32 n) {    // exact: bf16 x bf16
  unary(in, out, n, [](vf x) { return xdna::bmul(x, x); });
}
void abs_f32(const float *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return aie::abs(x); });
}
void exp_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return xdna::exp_f32(x); });
}
void sigmoid_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return xdna::sigmoid_f32(x); });
}
void silu_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return xdna::silu_f32(x); });
}
void tanh_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return xdna::tanh_f32(x); });
}
void gelu_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return xdna::gelu_f32(x); });
}
void gelu_tanh_bf16_f32(const bfloat16 *in, float *out, int32 n) {
  unary(in, out, n, [](vf x) { return xdna::gelu_tanh_f32(x); });
}
// SwiGLU's gate: silu(gate) * up, both bf16 operands.
void silu_mul_bf16_f32(const bfloat16 *gate, const bfloat16 *up, float *out, int32 n) {
  binary(gate, up, out, n, [](vf g, vf u) { return xdna::fmul(xdna::silu_f32(g), u); });
}
// The GeGLU MLP's gate (Gemma): gelu_tanh(gate) * up in fp32 on bf16 operands.
void gelu_tanh_mul_bf16_f32(const bfloat16 *gate, const bfloat16 *up, float *out, int32 n) {
  binary(gate, up, out, n, [](vf g, vf u) { return xdna::fmul(xdna::gelu_tanh_f32(g), u); });
}
// fp32 -> bf16, round to nearest even, subnormals flushed.
void cast_f32_bf16(const float *in, bfloat16 *out, int32 n) {
  xdna::set_numerics();
  for (int i = 0; i < n; i += L) xdna::store_part(out, i, n, xdna::load_f32(in, i, n));
}

}  // extern "C"

// ---- the array IR's unit kernels for one-input ops: <op>_<in>_<out>(x, out, n) -------------------
// (kernels/lower/vector.py names a VectorDesign unit kernel by op, input and output dtype.) Inputs
// may be fp32 or bf16: ops off the exact fp32 path round an fp32 input to its bf16 operand first
// (numerics.operand: nearest even, subnormals flushed); outputs are fp32 or rounded to bf16.
template <bool EXACT, typename TI, typename TO, typename F>
static inline void unit(const TI *__restrict in, TO *__restrict out, int32 n, F f) {
  xdna::set_numerics();
  for (int i = 0; i < n; i += L) {
    vf x = xdna::load_f32(in, i, n);
    if constexpr (!EXACT && std::is_same_v<TI, float>) x = xdna::to_f32(xdna::to_bf16(x));
    xdna::store_part(out, i, n, f(x));
  }
}

#define XDNA_UNIT(op, exact, in_t, in_n, out_t, out_n, expr)                                       \
  void op##_##in_n##_##out_n(const in_t *in, out_t *out, int32 n) {                               \
    unit<exact>(in, out, n, [](vf x) { return expr; });                                           \
  }
// every combination but <op>_bf16_f32 of the ops above, which already has this signature
#define XDNA_UNIT3(op, exact, expr)                                                                \
  XDNA_UNIT(op, exact, float, f32, float, f32, expr)                                               \
  XDNA_UNIT(op, exact, float, f32, bfloat16, bf16, expr)                                           \
  XDNA_UNIT(op, exact, bfloat16, bf16, bfloat16, bf16, expr)
#define XDNA_UNIT4(op, exact, expr)                                                                \
  XDNA_UNIT3(op, exact, expr) XDNA_UNIT(op, exact, bfloat16, bf16, float, f32, expr)

extern "C" {
XDNA_UNIT4(neg, true, aie::neg(x))
XDNA_UNIT4(relu, true, aie::max(x, 0.0f))
XDNA_UNIT4(abs, true, aie::abs(x))
XDNA_UNIT3(exp, false, xdna::exp_f32(x))
XDNA_UNIT3(sigmoid, false, xdna::sigmoid_f32(x))
XDNA_UNIT3(silu, false, xdna::silu_f32(x))
XDNA_UNIT3(tanh, false, xdna::tanh_f32(x))
XDNA_UNIT3(gelu, false, xdna::gelu_f32(x))
XDNA_UNIT3(gelu_tanh, false, xdna::gelu_tanh_f32(x))
XDNA_UNIT3(reciprocal, false, aie::inv(x))
XDNA_UNIT3(sqrt, false, aie::sqrt(x))
XDNA_UNIT3(rsqrt, false, aie::invsqrt(x))
XDNA_UNIT3(square, false, xdna::bmul(x, x))
}
