// The array IR's two-input unit kernels for AIE2P (kernels/lower/vector.py): one unit of a
// VectorDesign binary op, and the gated GEMM's last stage.
//
// Two argument forms, two symbols (a C signature cannot take both):
//   <op>_<in>_<out>(a, b, out, n)       the inputs in two buffers (two channels, or the second
//                                       a resident operand repeated to the unit)
//   <op>_pk_<in>_<out>(ab, out, n)      both inputs packed in one buffer: a = ab[0:n],
//                                       b = ab[n:2n] (one channel carries both, in order)
// Numerics (numerics.py, vector.py): add / sub / maximum / minimum are on the exact fp32 path
// (bf16 operands widen exactly); mul / div see bf16 operands (an fp32 input rounds to nearest
// even first) and compute in fp32, div as x * inv(y) like div_bf16_f32; a bf16 output rounds to
// nearest even. int32 ops wrap (two's complement), as torch's. gate_mul multiplies two fp32
// accumulators as they are (GatedGemmDesign). Golden: golden.binary (bit-exact).
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

template <bool EXACT, typename TI, typename TO, typename F>
static inline void bin(const TI *__restrict a, const TI *__restrict b, TO *__restrict out, int32 n,
                       F f) {
  xdna::set_numerics();
  for (int i = 0; i < n; i += L) {
    vf x = xdna::load_f32(a, i, n), y = xdna::load_f32(b, i, n);
    if constexpr (!EXACT && std::is_same_v<TI, float>) {
      x = xdna::to_f32(xdna::to_bf16(x));
      y = xdna::to_f32(xdna::to_bf16(y));
    }
    xdna::store_part(out, i, n, f(x, y));
  }
}

// int32 lanes: element by element (wrapping arithmetic through uint32).
template <typename F>
static inline void bin_i32(const int32 *a, const int32 *b, int32 *out, int32 n, F f) {
  for (int i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

#define XDNA_BIN(op, exact, in_t, in_n, out_t, out_n, expr)                                        \
  void op##_##in_n##_##out_n(const in_t *a, const in_t *b, out_t *out, int32 n) {                  \
    bin<exact>(a, b, out, n, [](vf x, vf y) { return expr; });                                     \
  }                                                                                                \
  void op##_pk_##in_n##_##out_n(const in_t *ab, out_t *out, int32 n) {                             \
    bin<exact>(ab, ab + n, out, n, [](vf x, vf y) { return expr; });                               \
  }
#define XDNA_BIN_PK(op, exact, in_t, in_n, out_t, out_n, expr)                                     \
  void op##_pk_##in_n##_##out_n(const in_t *ab, out_t *out, int32 n) {                             \
    bin<exact>(ab, ab + n, out, n, [](vf x, vf y) { return expr; });                               \
  }
#define XDNA_BIN4(op, exact, expr)                                                                 \
  XDNA_BIN(op, exact, float, f32, float, f32, expr)                                                \
  XDNA_BIN(op, exact, float, f32, bfloat16, bf16, expr)                                            \
  XDNA_BIN(op, exact, bfloat16, bf16, bfloat16, bf16, expr)                                        \
  XDNA_BIN(op, exact, bfloat16, bf16, float, f32, expr)
// mul_bf16_f32 / div_bf16_f32 (a, b, out, n) are eltwise.cc's, with this signature
#define XDNA_BIN3(op, exact, expr)                                                                 \
  XDNA_BIN(op, exact, float, f32, float, f32, expr)                                                \
  XDNA_BIN(op, exact, float, f32, bfloat16, bf16, expr)                                            \
  XDNA_BIN(op, exact, bfloat16, bf16, bfloat16, bf16, expr)                                        \
  XDNA_BIN_PK(op, exact, bfloat16, bf16, float, f32, expr)
#define XDNA_BIN_I32(op, expr)                                                                     \
  void op##_i32_i32(const int32 *a, const int32 *b, int32 *out, int32 n) {                         \
    bin_i32(a, b, out, n, [](int32 x, int32 y) { return int32(expr); });                           \
  }                                                                                                \
  void op##_pk_i32_i32(const int32 *ab, int32 *out, int32 n) {                                     \
    bin_i32(ab, ab + n, out, n, [](int32 x, int32 y) { return int32(expr); });                     \
  }

extern "C" {
XDNA_BIN4(add, true, aie::add(x, y))
XDNA_BIN4(sub, true, aie::sub(x, y))
XDNA_BIN4(maximum, true, aie::max(x, y))
XDNA_BIN4(minimum, true, aie::min(x, y))
XDNA_BIN3(mul, false, xdna::bmul(x, y))            // bf16 operands: exact
XDNA_BIN3(div, false, xdna::fmul(x, aie::inv(y)))
XDNA_BIN_I32(add, uint32(x) + uint32(y))
XDNA_BIN_I32(sub, uint32(x) - uint32(y))
XDNA_BIN_I32(mul, uint32(x) * uint32(y))
XDNA_BIN_I32(maximum, x < y ? y : x)
XDNA_BIN_I32(minimum, y < x ? y : x)
XDNA_BIN(gate_mul, true, float, f32, float, f32, xdna::fmul(x, y))
XDNA_BIN(gate_mul, true, float, f32, bfloat16, bf16, xdna::fmul(x, y))
}
