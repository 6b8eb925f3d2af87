// Zero an accumulator tile (DIM_M x DIM_N) before the first K block of a matmul.
#include "xdna_vec.h"

#ifndef DIM_M
#define DIM_M 32
#endif
#ifndef DIM_N
#define DIM_N 32
#endif

template <typename T, unsigned lanes>
static inline void zero_tile(T *__restrict c) {
  static_assert((DIM_M * DIM_N) % lanes == 0, "tile must be a whole number of vectors");
  const auto z = aie::zeros<T, lanes>();
  for (unsigned i = 0; i < DIM_M * DIM_N; i += lanes) aie::store_v(c + i, z);
}

extern "C" {
void zero_f32(float *c) { zero_tile<float, 16>(c); }
void zero_i32(int32 *c) { zero_tile<int32, 16>(c); }
}
