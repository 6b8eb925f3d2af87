// Weight dequantization for a quantized GEMM (prefill) on AIE2P: W [DIM_N, DIM_K] int8 or packed
// int4 with bf16 group scales [DIM_N, DIM_K / GROUP] -> B = dequant(W)^T [DIM_K, DIM_N] as the
// bf16 tiles matmul_bf16_f32 takes (mm.cc: s x t = 8 x 8 tiles, tile (kb, nb) at kb*(DIM_N/8)+nb,
// row-major inside). The core then runs matmul_bf16_f32 on the tile: GemmDesign's weight-only
// numerics (bf16(q * scale) operands, fp32 accumulation) for M > 1.
// Golden: golden.dequant_tiles (numerics.bf16_round(quant.dequantize(...)), tiled).
#include "xdna_quant.h"

#ifndef DIM_K
#define DIM_K 64
#endif
#ifndef DIM_N
#define DIM_N 32
#endif
#ifndef GROUP
#define GROUP 32
#endif

static_assert(GROUP % 32 == 0 && DIM_K % GROUP == 0, "GROUP: a multiple of 32 dividing DIM_K");
static_assert(DIM_N % 8 == 0, "DIM_N: a multiple of the mmul t = 8");

template <bool INT4>
static inline void dequant_tiles(const uint8 *__restrict w, const bfloat16 *__restrict scales,
                                 bfloat16 *__restrict b) {
  constexpr unsigned T = 8, S = 8, V = xdna::QV;
  constexpr unsigned row_bytes = INT4 ? DIM_K / 2 : DIM_K;
  xdna::set_numerics();
  for (unsigned nb = 0; nb < DIM_N / T; ++nb)
    for (unsigned k0 = 0; k0 < DIM_K; k0 += V) {
      alignas(64) bfloat16 blk[T * V];            // 8 output columns x 32 k, dequantized
      for (unsigned r = 0; r < T; ++r) {
        const unsigned n = nb * T + r;
        const bfloat16 sc = scales[n * (DIM_K / GROUP) + k0 / GROUP];
        aie::store_v(blk + r * V, xdna::dequant_chunk<INT4>(w + n * row_bytes, k0, sc));
      }
      for (unsigned j = 0; j < V / S; ++j) {     // 8 n x 8 k -> the 8 k x 8 n tile of B
        const bfloat16 *p = blk + j * S;
        auto nk = aie::concat(aie::load_v<8>(p), aie::load_v<8>(p + V), aie::load_v<8>(p + 2 * V),
                              aie::load_v<8>(p + 3 * V), aie::load_v<8>(p + 4 * V),
                              aie::load_v<8>(p + 5 * V), aie::load_v<8>(p + 6 * V),
                              aie::load_v<8>(p + 7 * V));
        const unsigned kb = (k0 + j * S) / S;
        aie::store_v(b + (kb * (DIM_N / T) + nb) * (S * T), aie::transpose(nk, T, S));
      }
    }
}

extern "C" {
void dequant_i8_bf16(const int8 *w, const bfloat16 *scales, bfloat16 *b) {
  dequant_tiles<false>(reinterpret_cast<const uint8 *>(w), scales, b);
}
void dequant_i4_bf16(const uint8 *w, const bfloat16 *scales, bfloat16 *b) {
  dequant_tiles<true>(w, scales, b);
}
}
