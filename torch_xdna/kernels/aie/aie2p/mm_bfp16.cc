// bfp16 matrix multiply for AIE2P: C (DIM_M x DIM_N, fp32) += A (bf16) * B, B given as bfp16ebs8.
//
// AIE2P multiplies bfp16ebs8 blocks natively (8x8x8, fp32 accumulation; hw/generations.py
// mmul_shape["bfp16"]). Tiles as the array IR passes them (kernels/lower/gemm.py), row-major:
//   A  [DIM_M, DIM_K] bf16, converted to blocks on the core (one block = 8 consecutive k of a
//      row: shared exponent, mantissas truncated toward -inf, quant.py);
//   Bt [DIM_N, DIM_K / 8 * 9] bytes: row n is quant.encode_bfp16 of column n of B (blocks of 8 k,
//      9 bytes [exponent, m0..m7] each), the weight format (9/8 bytes per value);
//   C  [DIM_M, DIM_N] fp32, accumulated in place (zero.cc first).
// mac_8x8_8x8T (mlir-aie aie2p mm_bfp.cc) takes an 8 x 8 sub-tile of B^T as one 72-byte block
// vector; a DMA cannot gather 9-byte blocks, so the core stages the eight 9-byte blocks of a
// sub-tile (one per row n) into a 72-byte buffer with byte copies before popping it. (mlir-aie
// instead shuffles the encoded weight on the host, python/utils/bfp.py shuffle; a lowering that
// does so could drop the staging.)
// Golden: golden.matmul_bfp16.
#include "xdna_mm.h"   // tile defines and rows_x8, shared with the bf16/int8 matmuls

static inline void store_8x8(float *p, unsigned ld, unsigned r0, unsigned c0,
                             const aie::vector<float, 64> &v) {
  for (unsigned i = 0; i < 8; ++i) aie::store_v(p + (r0 + i) * ld + c0, v.extract<8>(i));
}

// The 8 x 8 sub-tile (rows n0.., k block kb) of Bt as one block vector.
static inline aie::block_vector<bfp16ebs8, 64> bt_block(const uint8 *bt, unsigned n0, unsigned kb) {
  constexpr unsigned row_bytes = DIM_K / 8 * 9;
  alignas(64) uint8 stage[72];
  for (unsigned r = 0; r < 8; ++r)
    for (unsigned b = 0; b < 9; ++b) stage[r * 9 + b] = bt[(n0 + r) * row_bytes + kb * 9 + b];
  aie::block_vector_input_buffer_stream<bfp16ebs8, 64> in(reinterpret_cast<const bfp16ebs8 *>(stage));
  return in.pop();
}

static inline void matmul_bfp16(const bfloat16 *__restrict pA, const uint8 *__restrict pBt,
                                float *__restrict pC) {
  constexpr unsigned r = 8, s = 8, t = 8;
  static_assert(DIM_M % r == 0 && DIM_K % s == 0 && DIM_N % t == 0,
                "bfp16 tiles: DIM_M, DIM_K, DIM_N multiples of 8");
  xdna::set_numerics();
  if constexpr (DIM_M % (2 * r) != 0 || DIM_N % (2 * t) != 0) {   // one 8x8 block at a time
    for (unsigned z = 0; z < DIM_M; z += r)
      for (unsigned j = 0; j < DIM_N; j += t) {
        aie::accum<accfloat, 64> c(rows_x8<8>(pC, DIM_N, z, j));
        for (unsigned k = 0; k < DIM_K; k += s) {
          aie::accum<accfloat, 64> a(rows_x8<8>(pA, DIM_K, z, k));
          c = mac_8x8_8x8T(a.to_vector<bfp16ebs8>(), bt_block(pBt, j, k / s), c);
        }
        store_8x8(pC, DIM_N, z, j, c.to_vector<float>());
      }
    return;
  }
  for (unsigned z = 0; z < DIM_M; z += 2 * r) XDNA_PIPELINE {
    for (unsigned j = 0; j < DIM_N; j += 2 * t) {
      aie::accum<accfloat, 64> c00(rows_x8<8>(pC, DIM_N, z, j)), c01(rows_x8<8>(pC, DIM_N, z, j + t));
      aie::accum<accfloat, 64> c10(rows_x8<8>(pC, DIM_N, z + r, j));
      aie::accum<accfloat, 64> c11(rows_x8<8>(pC, DIM_N, z + r, j + t));
      for (unsigned k = 0; k < DIM_K; k += s) {
        aie::accum<accfloat, 64> a0(rows_x8<8>(pA, DIM_K, z, k)), a1(rows_x8<8>(pA, DIM_K, z + r, k));
        auto A0 = a0.to_vector<bfp16ebs8>();
        auto A1 = a1.to_vector<bfp16ebs8>();
        auto B0 = bt_block(pBt, j, k / s);
        auto B1 = bt_block(pBt, j + t, k / s);
        c00 = mac_8x8_8x8T(A0, B0, c00);
        c01 = mac_8x8_8x8T(A0, B1, c01);
        c10 = mac_8x8_8x8T(A1, B0, c10);
        c11 = mac_8x8_8x8T(A1, B1, c11);
      }
      store_8x8(pC, DIM_N, z, j, c00.to_vector<float>());
      store_8x8(pC, DIM_N, z, j + t, c01.to_vector<float>());
      store_8x8(pC, DIM_N, z + r, j, c10.to_vector<float>());
      store_8x8(pC, DIM_N, z + r, j + t, c11.to_vector<float>());
    }
  }
}

extern "C" {
void matmul_bf16_bfp16_f32(const bfloat16 *a, const uint8 *bt, float *c) {
  matmul_bfp16(a, bt, c);
}
}
