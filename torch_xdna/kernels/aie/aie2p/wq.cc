// Weight-only quantized GEMM / GEMV tiles for AIE2P (int8 or int4 weights with bf16 group scales,
// bf16 activations, fp32 accumulation), with the signature the array IR declares
// (kernels/lower/gemm.py):
//   <matmul|gemv>_<int8|int4>_bf16(A, P, Wdq, acc, group, sg)
//   A    [DIM_M, DIM_K] bf16, row-major
//   P    bytes: the W tile [DIM_N, DIM_K] int8 (or [DIM_N, DIM_K / 2] packed int4,
//        quant.pack_int4), then its scale tile [DIM_N, sg] bf16
//   Wdq  [DIM_K, DIM_N] bf16 scratch (matmul: the dequantized B = bf16(W * scale)^T)
//   acc  [DIM_M, DIM_N] fp32, acc += A @ Wdq (zero.cc first)
//   group: the quantization group; a K tile inside one group (DIM_K < group) uses one scale
//   per row, else sg = DIM_K / group scales per row.
// Dequantization is xdna_quant.h's: bf16(q * scale), GemmDesign's weight-only operand.
// matmul_*: dequantize into Wdq (8 x 8 blocks transposed in registers), then the row-major bf16
// mmul of xdna_mm.h. gemv_*: per row of A and output n, 32 fp32 lanes accumulate a[k] * w[n, k]
// over the row, then reduce pairwise into acc (no Wdq).
// Goldens: golden.dequant_rowmajor + golden.matmul_rowmajor, golden.gemv_q.
#include "xdna_mm.h"
#include "xdna_quant.h"

static_assert(DIM_K % 32 == 0, "weight-only tiles: DIM_K must be a multiple of 32");
static_assert(DIM_N % 8 == 0, "weight-only tiles: DIM_N must be a multiple of 8");

template <bool INT4>
static inline const bfloat16 *scale_tile(const uint8 *p) {
  return reinterpret_cast<const bfloat16 *>(p + (INT4 ? DIM_N * DIM_K / 2 : DIM_N * DIM_K));
}

template <bool INT4>
static inline void dequant_rows(const uint8 *__restrict p, bfloat16 *__restrict wdq, int32 group,
                                int32 sg) {
  constexpr unsigned T = 8, S = 8, V = xdna::QV, row_bytes = INT4 ? DIM_K / 2 : DIM_K;
  const unsigned g = unsigned(group) < DIM_K ? unsigned(group) : DIM_K;
  const bfloat16 *scales = scale_tile<INT4>(p);
  for (unsigned n0 = 0; n0 < DIM_N; n0 += T)
    for (unsigned k0 = 0; k0 < DIM_K; k0 += V) {
      alignas(64) bfloat16 blk[T * V];            // 8 output columns x 32 k, dequantized
      for (unsigned r = 0; r < T; ++r) {
        const unsigned n = n0 + r;
        aie::store_v(blk + r * V, xdna::dequant_chunk<INT4>(
            p + n * row_bytes, k0, xdna::chunk_scales(scales + n * sg, k0, g)));
      }
      for (unsigned j = 0; j < V / S; ++j) {     // 8 n x 8 k -> 8 rows (k) of 8 n in Wdq
        const bfloat16 *b = blk + j * S;
        auto nk = aie::concat(aie::load_v<8>(b), aie::load_v<8>(b + V), aie::load_v<8>(b + 2 * V),
                              aie::load_v<8>(b + 3 * V), aie::load_v<8>(b + 4 * V),
                              aie::load_v<8>(b + 5 * V), aie::load_v<8>(b + 6 * V),
                              aie::load_v<8>(b + 7 * V));
        auto kn = aie::transpose(nk, T, S);
        for (unsigned kk = 0; kk < S; ++kk)
          aie::store_v(wdq + (k0 + j * S + kk) * DIM_N + n0, kn.extract<8>(kk));
      }
    }
}

template <bool INT4>
static inline void matmul_wq(const bfloat16 *a, const uint8 *p, bfloat16 *wdq, float *acc,
                             int32 group, int32 sg) {
  xdna::set_numerics();
  dequant_rows<INT4>(p, wdq, group, sg);
  matmul_bf16(a, wdq, acc);
}

template <bool INT4>
static inline void gemv_wq(const bfloat16 *__restrict a, const uint8 *__restrict p,
                           float *__restrict acc, int32 group, int32 sg) {
  constexpr unsigned V = xdna::QV, row_bytes = INT4 ? DIM_K / 2 : DIM_K;
  const unsigned g = unsigned(group) < DIM_K ? unsigned(group) : DIM_K;
  const bfloat16 *scales = scale_tile<INT4>(p);
  xdna::set_numerics();
  for (unsigned m = 0; m < DIM_M; ++m)
    for (unsigned n = 0; n < DIM_N; ++n) {
      aie::accum<accfloat, V> lanes = aie::zeros<accfloat, V>();
      for (unsigned k = 0; k < DIM_K; k += V) {
        auto w = xdna::dequant_chunk<INT4>(p + n * row_bytes, k, xdna::chunk_scales(scales + n * sg, k, g));
        lanes = aie::mac(lanes, aie::load_v<V>(a + m * DIM_K + k), w);
      }
      acc[m * DIM_N + n] = acc[m * DIM_N + n] + aie::reduce_add(lanes.to_vector<float>());
    }
}

extern "C" {
void matmul_int8_bf16(const bfloat16 *a, const uint8 *p, bfloat16 *wdq, float *acc, int32 group,
                      int32 sg) {
  matmul_wq<false>(a, p, wdq, acc, group, sg);
}
void matmul_int4_bf16(const bfloat16 *a, const uint8 *p, bfloat16 *wdq, float *acc, int32 group,
                      int32 sg) {
  matmul_wq<true>(a, p, wdq, acc, group, sg);
}
void gemv_int8_bf16(const bfloat16 *a, const uint8 *p, bfloat16 *wdq, float *acc, int32 group,
                    int32 sg) {
  (void)wdq;
  gemv_wq<false>(a, p, acc, group, sg);
}
void gemv_int4_bf16(const bfloat16 *a, const uint8 *p, bfloat16 *wdq, float *acc, int32 group,
                    int32 sg) {
  (void)wdq;
  gemv_wq<true>(a, p, acc, group, sg);
}
}
