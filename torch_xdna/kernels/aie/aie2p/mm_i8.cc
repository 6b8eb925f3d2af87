// int8 matrix-multiply micro-kernel for AIE2P: C (DIM_M x DIM_N, int32) += A (DIM_M x DIM_K) *
// B (DIM_K x DIM_N), int8 operands, every tile row-major as the array IR passes them; mmul
// 8x8x8 (hw/generations.py), 2x2 expansion as mm.cc. Exact int32 accumulation.
// Golden: golden.matmul_rowmajor. (Its own source: an object holds every symbol of its source,
// and int8 needs DIM_K, DIM_N multiples of 16 where bf16 needs 8.)
#include "xdna_mm.h"

// int8: mmul 8x8x8. An 8-element int8 row segment is 64 bits, below the smallest vector
// (128 bits), so 8 rows are loaded 16 wide (an 8 x 16 block) and split into its left and right
// 8 x 8 halves by transposes: A over two k blocks, B over the two column blocks of the 2x2
// expansion.
static inline aie::vector<int8, 64> half_8x16(const aie::vector<int8, 128> &v, unsigned h) {
  aie::vector<int8, 64> cols = aie::transpose(v, 8, 16).extract<64>(h);   // 8 columns x 8 rows
  return aie::transpose(cols, 8, 8);                                     // 8 rows x 8 columns
}
static inline aie::vector<int8, 128> rows_8x16(const int8 *p, unsigned ld, unsigned r0, unsigned c0) {
  return aie::concat(aie::load_v<16>(p + (r0 + 0) * ld + c0), aie::load_v<16>(p + (r0 + 1) * ld + c0),
                     aie::load_v<16>(p + (r0 + 2) * ld + c0), aie::load_v<16>(p + (r0 + 3) * ld + c0),
                     aie::load_v<16>(p + (r0 + 4) * ld + c0), aie::load_v<16>(p + (r0 + 5) * ld + c0),
                     aie::load_v<16>(p + (r0 + 6) * ld + c0), aie::load_v<16>(p + (r0 + 7) * ld + c0));
}

static inline void matmul_i8(const int8 *__restrict pA, const int8 *__restrict pB,
                             int32 *__restrict pC) {
  constexpr unsigned r = 8, s = 8, t = 8;
  using MMUL = aie::mmul<r, s, t, int8, int8>;
  static_assert(DIM_M % r == 0, "DIM_M must be a multiple of 8");
  static_assert(DIM_K % (2 * s) == 0, "DIM_K must be a multiple of 16 (int8 rows load 16 wide)");
  static_assert(DIM_N % (2 * t) == 0, "DIM_N must be a multiple of 16 (int8 rows load 16 wide)");
  if constexpr (DIM_M % (2 * r) != 0) {         // one row block at a time (small-M tiles)
    for (unsigned z = 0; z < DIM_M; z += r)
      for (unsigned j = 0; j < DIM_N; j += 2 * t) {
        MMUL C00(rows_x8<r>(pC, DIM_N, z, j)), C01(rows_x8<r>(pC, DIM_N, z, j + t));
        for (unsigned k = 0; k < DIM_K; k += 2 * s) {
          const auto a0 = rows_8x16(pA, DIM_K, z, k);
          const auto b_lo = rows_8x16(pB, DIM_N, k, j), b_hi = rows_8x16(pB, DIM_N, k + s, j);
          for (unsigned h = 0; h < 2; ++h) {
            const auto A0 = half_8x16(a0, h);
            const auto &bk = h == 0 ? b_lo : b_hi;
            C00.mac(A0, half_8x16(bk, 0));
            C01.mac(A0, half_8x16(bk, 1));
          }
        }
        store_rows_x8<r>(pC, DIM_N, z, j, C00.to_vector<int32>());
        store_rows_x8<r>(pC, DIM_N, z, j + t, C01.to_vector<int32>());
      }
    return;
  }
  for (unsigned z = 0; z < DIM_M; z += 2 * r) XDNA_PIPELINE {
    for (unsigned j = 0; j < DIM_N; j += 2 * t) {
      MMUL C00(rows_x8<r>(pC, DIM_N, z, j)), C01(rows_x8<r>(pC, DIM_N, z, j + t));
      MMUL C10(rows_x8<r>(pC, DIM_N, z + r, j)), C11(rows_x8<r>(pC, DIM_N, z + r, j + t));
      for (unsigned k = 0; k < DIM_K; k += 2 * s) {
        const auto a0 = rows_8x16(pA, DIM_K, z, k), a1 = rows_8x16(pA, DIM_K, z + r, k);
        const auto b_lo = rows_8x16(pB, DIM_N, k, j), b_hi = rows_8x16(pB, DIM_N, k + s, j);
        for (unsigned h = 0; h < 2; ++h) {             // k block h: ascending k per lane
          const auto A0 = half_8x16(a0, h), A1 = half_8x16(a1, h);
          const auto &bk = h == 0 ? b_lo : b_hi;
          const auto B0 = half_8x16(bk, 0), B1 = half_8x16(bk, 1);
          C00.mac(A0, B0);
          C01.mac(A0, B1);
          C10.mac(A1, B0);
          C11.mac(A1, B1);
        }
      }
      store_rows_x8<r>(pC, DIM_N, z, j, C00.to_vector<int32>());
      store_rows_x8<r>(pC, DIM_N, z, j + t, C01.to_vector<int32>());
      store_rows_x8<r>(pC, DIM_N, z + r, j, C10.to_vector<int32>());
      store_rows_x8<r>(pC, DIM_N, z + r, j + t, C11.to_vector<int32>());
    }
  }
}

extern "C" {

// int8 x int8 -> int32 (mmul 8x8x8).
void matmul_i8_i32(const int8 *a, const int8 *b, int32 *c) { matmul_i8(a, b, c); }

}  // extern "C"
