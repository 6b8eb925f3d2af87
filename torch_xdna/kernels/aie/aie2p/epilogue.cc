// GEMM epilogue stage for AIE2P, the array IR's epilogue units (kernels/lower/vector.py
// epilogue_program): over whole output rows of `cols`, C = act(T + beta * bias) (+ R), where T is
// the GEMM stage's fp32 accumulator (alpha already applied), bias one bf16 row of `cols`
// (resident), R an fp32 residual. n = elements in the unit (a multiple of cols).
//   epilogue_<act>[_bias]_f32_<out>(T, [bias], C, n, cols, beta)
//   epilogue_<act>_res_f32_<out>(T, R, C, n, cols, beta)          T and R on two channels
//   epilogue_<act>[_bias]_res_pk_f32_<out>(TR, [bias], C, n, cols, beta)
//                                                                  T and R packed: R = TR + n
// Activations are xdna_vec.h's (as store.cc); beta * bias is one fp32 multiply (exact for
// beta = 1). A bf16 output rounds to nearest even. Golden: golden.epilogue (bit-exact).
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

template <typename TO, typename F>
static inline void epi(const float *t, const float *r, const bfloat16 *bias, TO *out, int32 n,
                       int32 cols, float beta, F act) {
  xdna::set_numerics();
  for (int row = 0; row < n; row += cols)
    for (int i = 0; i < cols; i += L) {
      vf x = xdna::load_f32(t + row, i, cols);
      if (bias) x = aie::add(x, xdna::fmul(xdna::load_f32(bias, i, cols), beta));
      x = act(x);
      if (r) x = aie::add(x, xdna::load_f32(r + row, i, cols));
      xdna::store_part(out + row, i, cols, x);
    }
}

#define XDNA_EPI_OUT(act, on, to, expr)                                                            \
  void epilogue_##act##_f32_##on(const float *t, to *c, int32 n, int32 cols, float beta) {        \
    epi(t, nullptr, nullptr, c, n, cols, beta, [](vf x) { return expr; });                         \
  }                                                                                                \
  void epilogue_##act##_bias_f32_##on(const float *t, const bfloat16 *b, to *c, int32 n,           \
                                      int32 cols, float beta) {                                    \
    epi(t, nullptr, b, c, n, cols, beta, [](vf x) { return expr; });                               \
  }                                                                                                \
  void epilogue_##act##_res_f32_##on(const float *t, const float *r, to *c, int32 n, int32 cols,  \
                                     float beta) {                                                 \
    epi(t, r, nullptr, c, n, cols, beta, [](vf x) { return expr; });                               \
  }                                                                                                \
  void epilogue_##act##_res_pk_f32_##on(const float *tr, to *c, int32 n, int32 cols, float beta) { \
    epi(tr, tr + n, nullptr, c, n, cols, beta, [](vf x) { return expr; });                         \
  }                                                                                                \
  void epilogue_##act##_bias_res_pk_f32_##on(const float *tr, const bfloat16 *b, to *c, int32 n,   \
                                             int32 cols, float beta) {                             \
    epi(tr, tr + n, b, c, n, cols, beta, [](vf x) { return expr; });                               \
  }
#define XDNA_EPI(act, expr)                                                                        \
  XDNA_EPI_OUT(act, f32, float, expr)                                                              \
  XDNA_EPI_OUT(act, bf16, bfloat16, expr)

extern "C" {
XDNA_ACTIVATIONS(XDNA_EPI)
}
