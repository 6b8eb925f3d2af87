// GEMV with quantized weights for AIE2P: c[n] += sum_k a[k] * dequant(W[n, k]) for one tile of
// DIM_N output rows and DIM_K inputs.
//
// W is row-major [DIM_N, DIM_K]: int8, or int4 packed two per byte (element 2i in the low nibble,
// quant.pack_int4). scales are bf16 [DIM_N, DIM_K / GROUP] (quant.quantize_int8/int4). Each
// 32-value chunk is dequantized on the core (xdna_quant.h: bf16(q * scale), GemmDesign's
// weight-only operand); the dot product accumulates in 32 fp32 lanes over the row, which are then reduced pairwise and
// added to c[n] (c accumulates across K tiles; zero it first).
// Golden: golden.gemv_q.
#include "xdna_quant.h"

#ifndef DIM_K
#define DIM_K 128
#endif
#ifndef DIM_N
#define DIM_N 16
#endif
#ifndef GROUP
#define GROUP 32
#endif

static_assert(GROUP % 32 == 0 && DIM_K % GROUP == 0, "GROUP: a multiple of 32 dividing DIM_K");

template <bool INT4>
static inline void gemv_q(const bfloat16 *__restrict a, const uint8 *__restrict w,
                          const bfloat16 *__restrict scales, float *__restrict c) {
  constexpr unsigned V = xdna::QV;
  constexpr unsigned row_bytes = INT4 ? DIM_K / 2 : DIM_K;
  xdna::set_numerics();
  for (unsigned n = 0; n < DIM_N; ++n) {
    const uint8 *wr = w + n * row_bytes;
    aie::accum<accfloat, V> acc = aie::zeros<accfloat, V>();
    for (unsigned k = 0; k < DIM_K; k += V) {
      bfloat16 sc = scales[n * (DIM_K / GROUP) + k / GROUP];
      acc = aie::mac(acc, aie::load_v<V>(a + k), xdna::dequant_chunk<INT4>(wr, k, sc));
    }
    c[n] = c[n] + aie::reduce_add(acc.to_vector<float>());
  }
}

extern "C" {
void gemv_bf16_i8_f32(const bfloat16 *a, const int8 *w, const bfloat16 *scales, float *c) {
  gemv_q<false>(a, reinterpret_cast<const uint8 *>(w), scales, c);
}
void gemv_bf16_i4_f32(const bfloat16 *a, const uint8 *w, const bfloat16 *scales, float *c) {
  gemv_q<true>(a, w, scales, c);
}
}
