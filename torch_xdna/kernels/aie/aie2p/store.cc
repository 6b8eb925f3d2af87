// GEMM epilogue store for AIE2P, the array IR's store_<act>_<acc>_<out>(acc, C, alpha)
// (kernels/lower/gemm.py): C = act(alpha * acc) for a DIM_M x DIM_N accumulator tile, in fp32
// (xdna_vec.h's activations), stored as fp32 or rounded to bf16 (nearest even); int32
// accumulators are stored as they are (store_none_i32_i32). Golden: golden.store.
#include "xdna_vec.h"

#ifndef DIM_M
#define DIM_M 32
#endif
#ifndef DIM_N
#define DIM_N 32
#endif
// rows of C stored: the first DIM_MC of the tile's DIM_M (a tile whose other rows are padding,
// kernels/lower/gemm.py: one M block shorter than a tile); the whole tile by default
#ifndef DIM_MC
#define DIM_MC DIM_M
#endif
static_assert(DIM_MC <= DIM_M, "store: more rows stored than the tile has");

using xdna::L;
using xdna::vf;

template <typename T, typename F>
static inline void store_tile(const float *__restrict acc, T *__restrict c, float alpha, F act) {
  xdna::set_numerics();
  for (int i = 0; i < DIM_MC * DIM_N; i += L)
    xdna::store_part(c, i, DIM_MC * DIM_N, act(xdna::fmul(xdna::load_f32(acc, i, DIM_MC * DIM_N), alpha)));
}

#define XDNA_STORE(act, expr)                                                                     \
  void store_##act##_f32_f32(const float *acc, float *c, float alpha) {                          \
    store_tile(acc, c, alpha, [](vf x) { return expr; });                                          \
  }                                                                                                \
  void store_##act##_f32_bf16(const float *acc, bfloat16 *c, float alpha) {                      \
    store_tile(acc, c, alpha, [](vf x) { return expr; });                                          \
  }

extern "C" {
XDNA_ACTIVATIONS(XDNA_STORE)

void store_none_i32_i32(const int32 *acc, int32 *c, float alpha) {
  (void)alpha;                                  // integer GEMMs carry no alpha
  int i = 0;
  for (; i + 16 <= DIM_MC * DIM_N; i += 16) aie::store_v(c + i, aie::load_v<16>(acc + i));
  for (; i < DIM_MC * DIM_N; ++i) c[i] = acc[i];
}
}
