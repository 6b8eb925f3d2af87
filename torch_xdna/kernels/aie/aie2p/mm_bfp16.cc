// bfp16 matrix multiply for AIE2P: C (DIM_M x DIM_N, fp32) += A (bf16) * B (bfp16ebs8).
//
// AIE2P multiplies bfp16ebs8 blocks natively (8x8x8, fp32 accumulation; hw/generations.py
// mmul_shape["bfp16"]). A arrives as bf16 tiles of 8 x 8 (row-major) and is converted to blocks
// on the core (one block = one row of 8 k values, shared exponent, mantissas truncated toward
// -inf: quant.py); B arrives already encoded (9/8 bytes per value, the weight format), as 8 x 8
// tiles of B^T (one block = one output column n, 8 k values), tile (j, i) at index j*colA + i,
// the layout mlir-aie's aie2p mm_bfp.cc consumes with mac_8x8_8x8T. C tiles are 8 x 8 fp32,
// row-major, accumulated in place (zero.cc first).
// Golden: golden.matmul_bfp16 (quant.quantize_bfp16 operands, ascending-k fp32 adds).
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

static inline void matmul_bfp16_2x2(const bfloat16 *__restrict pA, const bfp16ebs8 *__restrict pB,
                                    float *__restrict pC) {
  constexpr unsigned r = 8, s = 8, t = 8;
  constexpr unsigned rowA = DIM_M / r, colA = DIM_K / s, colB = DIM_N / t;
  constexpr unsigned sizeA = r * s, sizeC = r * t;
  static_assert(DIM_M % (2 * r) == 0 && DIM_K % s == 0 && DIM_N % (2 * t) == 0,
                "bfp16 tiles: DIM_M, DIM_N multiples of 16, DIM_K of 8");
  xdna::set_numerics();
  for (unsigned z = 0; z < rowA; z += 2) XDNA_PIPELINE {
    float *__restrict pC1 = pC + (z * colB) * sizeC;
    float *__restrict pC2 = pC + ((z + 1) * colB) * sizeC;
    for (unsigned j = 0; j < colB; j += 2) {
      const bfloat16 *__restrict pA1 = pA + (z * colA) * sizeA;
      const bfloat16 *__restrict pA2 = pA + ((z + 1) * colA) * sizeA;
      aie::block_vector_input_buffer_stream<bfp16ebs8, 64> pB1(pB);
      aie::block_vector_input_buffer_stream<bfp16ebs8, 64> pB2(pB);
      pB1.seek(j * colA);
      pB2.seek((j + 1) * colA);
      aie::accum<accfloat, sizeC> c00(aie::load_v<sizeC>(pC1));
      aie::accum<accfloat, sizeC> c01(aie::load_v<sizeC>(pC1 + sizeC));
      aie::accum<accfloat, sizeC> c10(aie::load_v<sizeC>(pC2));
      aie::accum<accfloat, sizeC> c11(aie::load_v<sizeC>(pC2 + sizeC));
      for (unsigned i = 0; i < colA; ++i) {
        aie::accum<accfloat, sizeA> a0(aie::load_v<sizeA>(pA1)); pA1 += sizeA;
        aie::accum<accfloat, sizeA> a1(aie::load_v<sizeA>(pA2)); pA2 += sizeA;
        auto A0 = a0.to_vector<bfp16ebs8>();
        auto A1 = a1.to_vector<bfp16ebs8>();
        auto B0 = pB1.pop();
        auto B1 = pB2.pop();
        c00 = mac_8x8_8x8T(A0, B0, c00);
        c01 = mac_8x8_8x8T(A0, B1, c01);
        c10 = mac_8x8_8x8T(A1, B0, c10);
        c11 = mac_8x8_8x8T(A1, B1, c11);
      }
      aie::store_v(pC1, c00.to_vector<float>()); pC1 += sizeC;
      aie::store_v(pC1, c01.to_vector<float>()); pC1 += sizeC;
      aie::store_v(pC2, c10.to_vector<float>()); pC2 += sizeC;
      aie::store_v(pC2, c11.to_vector<float>()); pC2 += sizeC;
    }
  }
}

extern "C" {
void matmul_bf16_bfp16_f32(const bfloat16 *a, const bfp16ebs8 *b, float *c) {
  matmul_bfp16_2x2(a, b, c);
}
}
