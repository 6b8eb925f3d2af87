// Matrix-multiply micro-kernels for AIE2P: C (DIM_M x DIM_N) += A (DIM_M x DIM_K) * B (DIM_K x DIM_N).
//
// Operands are pre-tiled by the DMA into the native mmul shape r x s x t (hw/generations.py
// mmul_shape: bf16 4x8x8, int8 8x8x8): A is (DIM_M/r) x (DIM_K/s) tiles of r x s, B is
// (DIM_K/s) x (DIM_N/t) tiles of s x t, C is (DIM_M/r) x (DIM_N/t) tiles of r x t; tiles and
// the elements inside them are row-major (the aie::mmul layout). C accumulates in place (zero it
// with zero.cc before the first K block), so one kernel call per K block of the L1 tile.
// The 2x2 expansion (two A row-tiles x two B column-tiles per step) keeps four accumulators
// live, as mlir-aie's aie2p mm.cc does.
//
// Numerics: bf16 operands, fp32 accumulation; int8 operands, int32 accumulation.
// Golden: torch_xdna/kernels/aie/golden.py matmul_tiled (ascending-k fp32 adds / exact int).
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

template <typename T_in, typename T_out, unsigned r, unsigned s, unsigned t>
static inline void matmul_2x2(const T_in *__restrict pA, const T_in *__restrict pB,
                              T_out *__restrict pC) {
  using MMUL = aie::mmul<r, s, t, T_in, T_in>;
  constexpr unsigned rowA = DIM_M / r, colA = DIM_K / s, colB = DIM_N / t;
  static_assert(DIM_M % (2 * r) == 0, "DIM_M must be a multiple of 2r");
  static_assert(DIM_K % s == 0, "DIM_K must be a multiple of s");
  static_assert(DIM_N % (2 * t) == 0, "DIM_N must be a multiple of 2t");
  xdna::set_numerics();
  for (unsigned z = 0; z < rowA; z += 2) XDNA_PIPELINE {
    T_out *__restrict pC1 = pC + (z * colB) * MMUL::size_C;
    T_out *__restrict pC2 = pC + ((z + 1) * colB) * MMUL::size_C;
    for (unsigned j = 0; j < colB; j += 2) {
      const T_in *__restrict pA1 = pA + (z * colA) * MMUL::size_A;
      const T_in *__restrict pA2 = pA + ((z + 1) * colA) * MMUL::size_A;
      const T_in *__restrict pB1 = pB + j * MMUL::size_B;
      const T_in *__restrict pB2 = pB + (j + 1) * MMUL::size_B;
      MMUL C00(aie::load_v<MMUL::size_C>(pC1));
      MMUL C01(aie::load_v<MMUL::size_C>(pC1 + MMUL::size_C));
      MMUL C10(aie::load_v<MMUL::size_C>(pC2));
      MMUL C11(aie::load_v<MMUL::size_C>(pC2 + MMUL::size_C));
      for (unsigned i = 0; i < colA; ++i) {
        auto A0 = aie::load_v<MMUL::size_A>(pA1); pA1 += MMUL::size_A;
        auto A1 = aie::load_v<MMUL::size_A>(pA2); pA2 += MMUL::size_A;
        auto B0 = aie::load_v<MMUL::size_B>(pB1); pB1 += MMUL::size_B * colB;
        auto B1 = aie::load_v<MMUL::size_B>(pB2); pB2 += MMUL::size_B * colB;
        C00.mac(A0, B0);
        C01.mac(A0, B1);
        C10.mac(A1, B0);
        C11.mac(A1, B1);
      }
      aie::store_v(pC1, C00.template to_vector<T_out>()); pC1 += MMUL::size_C;
      aie::store_v(pC1, C01.template to_vector<T_out>()); pC1 += MMUL::size_C;
      aie::store_v(pC2, C10.template to_vector<T_out>()); pC2 += MMUL::size_C;
      aie::store_v(pC2, C11.template to_vector<T_out>()); pC2 += MMUL::size_C;
    }
  }
}

extern "C" {

// bf16 x bf16 -> fp32, mmul 4x8x8 (AIE2P native bf16 shape).
void matmul_bf16_f32(const bfloat16 *a, const bfloat16 *b, float *c) {
  matmul_2x2<bfloat16, float, 4, 8, 8>(a, b, c);
}

// int8 x int8 -> int32, mmul 8x8x8.
void matmul_i8_i32(const int8 *a, const int8 *b, int32 *c) {
  matmul_2x2<int8, int32, 8, 8, 8>(a, b, c);
}

}  // extern "C"
