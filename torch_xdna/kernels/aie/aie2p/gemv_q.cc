// GEMV with quantized weights for AIE2P: c[n] += sum_k a[k] * dequant(W[n, k]) for one tile of
// DIM_N output rows and DIM_K inputs.
//
// W is row-major [DIM_N, DIM_K]: int8, or int4 packed two per byte (element 2i in the low nibble,
// quant.pack_int4). scales are bf16 [DIM_N, DIM_K / GROUP] (quant.quantize_int8/int4). On the
// core each 32-value chunk is widened to bf16 (exact), multiplied by its group's scale and rounded
// to bf16 (RNE), i.e. numerics.bf16_round(q * scale) as GemmDesign's weight-only reference; the
// dot product accumulates in 32 fp32 lanes over the row, which are then reduced pairwise and
// added to c[n] (c accumulates across K tiles; zero it first).
// Golden: golden.gemv_q.
#include "xdna_vec.h"

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
  constexpr unsigned V = 32;
  constexpr unsigned row_bytes = INT4 ? DIM_K / 2 : DIM_K;
  xdna::set_numerics();
  for (unsigned n = 0; n < DIM_N; ++n) {
    const uint8 *wr = w + n * row_bytes;
    aie::accum<accfloat, V> acc = aie::zeros<accfloat, V>();
    for (unsigned k = 0; k < DIM_K; k += V) {
      aie::vector<int8, V> q;                     // widen int4 -> int8 -> int16 -> bf16 (exact)
      if constexpr (INT4) q = aie::unpack(aie::load_v<V>(reinterpret_cast<const int4 *>(wr + k / 2)));
      else q = aie::load_v<V>(reinterpret_cast<const int8 *>(wr + k));
      aie::vector<bfloat16, V> qf = aie::to_float<bfloat16>(aie::unpack(q), 0);
      bfloat16 sc = scales[n * (DIM_K / GROUP) + k / GROUP];
      aie::vector<bfloat16, V> wv = aie::mul(qf, sc).to_vector<bfloat16>();
      acc = aie::mac(acc, aie::load_v<V>(a + k), wv);
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
