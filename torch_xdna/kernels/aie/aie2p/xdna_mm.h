// Row-major matmul building blocks shared by mm.cc and wq.cc (see mm.cc for the layout and
// numerics): C (DIM_M x DIM_N) += A (DIM_M x DIM_K) * B (DIM_K x DIM_N), mmul blocks assembled
// in registers from row segments.
#pragma once

#include "xdna_vec.h"

#ifndef DIM_M
#define DIM_M 32
#endif
#ifndef DIM_K
#define DIM_K 32
#endif
#ifndef DIM_N
#define DIM_N 32
#endif

// rows x 8 elements at (r0, c0) of a row-major matrix with ld columns, as one vector
template <unsigned rows, typename T>
static inline aie::vector<T, rows * 8> rows_x8(const T *p, unsigned ld, unsigned r0, unsigned c0) {
  if constexpr (rows == 4)
    return aie::concat(aie::load_v<8>(p + (r0 + 0) * ld + c0), aie::load_v<8>(p + (r0 + 1) * ld + c0),
                       aie::load_v<8>(p + (r0 + 2) * ld + c0), aie::load_v<8>(p + (r0 + 3) * ld + c0));
  else
    return aie::concat(rows_x8<4>(p, ld, r0, c0), rows_x8<4>(p, ld, r0 + 4, c0));
}
template <unsigned rows, typename T>
static inline void store_rows_x8(T *p, unsigned ld, unsigned r0, unsigned c0,
                                 const aie::vector<T, rows * 8> &v) {
  for (unsigned i = 0; i < rows; ++i) aie::store_v(p + (r0 + i) * ld + c0, v.template extract<8>(i));
}

// bf16: mmul 4x8x8; every row segment is 8 x 16 bits (a 128-bit load). Tiles that are whole
// 2x2 expansions (DIM_M % 8, DIM_N % 16) keep four accumulators live; other tiles (the plans'
// small-M and narrow tiles: DIM_M % 4, DIM_N % 8) run one mmul block at a time. Each C lane adds
// its products in ascending k either way, so the numerics are the same.
static inline void matmul_bf16(const bfloat16 *__restrict pA, const bfloat16 *__restrict pB,
                               float *__restrict pC) {
  constexpr unsigned r = 4, s = 8, t = 8;
  using MMUL = aie::mmul<r, s, t, bfloat16, bfloat16>;
  static_assert(DIM_M % r == 0, "DIM_M must be a multiple of 4");
  static_assert(DIM_K % s == 0, "DIM_K must be a multiple of 8");
  static_assert(DIM_N % t == 0, "DIM_N must be a multiple of 8");
  xdna::set_numerics();
  if constexpr (DIM_M % (2 * r) != 0 || DIM_N % (2 * t) != 0) {
    for (unsigned z = 0; z < DIM_M; z += r)
      for (unsigned j = 0; j < DIM_N; j += t) {
        MMUL C(rows_x8<r>(pC, DIM_N, z, j));
        for (unsigned k = 0; k < DIM_K; k += s)
          C.mac(rows_x8<r>(pA, DIM_K, z, k), rows_x8<s>(pB, DIM_N, k, j));
        store_rows_x8<r>(pC, DIM_N, z, j, C.to_vector<float>());
      }
    return;
  }
  for (unsigned z = 0; z < DIM_M; z += 2 * r) XDNA_PIPELINE {
    for (unsigned j = 0; j < DIM_N; j += 2 * t) {
      MMUL C00(rows_x8<r>(pC, DIM_N, z, j)), C01(rows_x8<r>(pC, DIM_N, z, j + t));
      MMUL C10(rows_x8<r>(pC, DIM_N, z + r, j)), C11(rows_x8<r>(pC, DIM_N, z + r, j + t));
      for (unsigned k = 0; k < DIM_K; k += s) {
        auto A0 = rows_x8<r>(pA, DIM_K, z, k), A1 = rows_x8<r>(pA, DIM_K, z + r, k);
        auto B0 = rows_x8<s>(pB, DIM_N, k, j), B1 = rows_x8<s>(pB, DIM_N, k, j + t);
        C00.mac(A0, B0);
        C01.mac(A0, B1);
        C10.mac(A1, B0);
        C11.mac(A1, B1);
      }
      store_rows_x8<r>(pC, DIM_N, z, j, C00.to_vector<float>());
      store_rows_x8<r>(pC, DIM_N, z, j + t, C01.to_vector<float>());
      store_rows_x8<r>(pC, DIM_N, z + r, j, C10.to_vector<float>());
      store_rows_x8<r>(pC, DIM_N, z + r, j + t, C11.to_vector<float>());
    }
  }
}
