// Token embedding rows for AIE2P (kernels/lower/dma.py llm_embed_program): one gathered table row
// in the stored precision -> EMB_H fp32 values, times the embedding scale.
//   embed_<precision>_f32(row, out, group, scale)
//   row   fp32: EMB_H f32; bf16: EMB_H bf16 (as bytes); int8: EMB_H int8 then EMB_H / group bf16
//         scales (bytes); int4: EMB_H / 2 packed bytes (quant.pack_int4) then the bf16 scales
//   out   EMB_H fp32
// What EmbedDesign.reference computes: the row as the matmuls see it (blocks/weights.dequantize:
// bf16 values, bf16(q * scale) for int8 / int4 via xdna_quant.h), times bf16(scale) when the
// stored row is bf16-valued (bf16 x bf16 -> fp32, exact: no FP32 emulation). The fp32 row
// (verification mode) is multiplied in fp32, which AIE2P runs as aie_api's FP32 emulation
// (golden.fmul); a scale of 1 copies it. Golden: golden.embed_row.
#include "xdna_quant.h"

#ifndef EMB_H
#define EMB_H 64
#endif

static_assert(EMB_H % 32 == 0, "embedding rows: EMB_H must be a multiple of 32");

using xdna::L;
using xdna::vf;

static inline vf scale_bf16(float scale) {
  return xdna::to_f32(xdna::to_bf16(aie::broadcast<float, L>(scale)));
}

template <bool INT4>
static inline void embed_q(const uint8 *__restrict row, float *__restrict out, int32 group, float scale) {
  constexpr unsigned V = xdna::QV, row_bytes = INT4 ? EMB_H / 2 : EMB_H;
  const unsigned g = group > 0 ? unsigned(group) : EMB_H;
  const bfloat16 *scales = reinterpret_cast<const bfloat16 *>(row + row_bytes);
  xdna::set_numerics();
  const vf s = scale_bf16(scale);
  for (unsigned k = 0; k < EMB_H; k += V) {
    aie::vector<bfloat16, V> w = xdna::dequant_chunk<INT4>(row, k, xdna::chunk_scales(scales, k, g));
    for (unsigned h = 0; h < V; h += L)
      aie::store_v(out + k + h, xdna::bmul(xdna::to_f32(w.extract<L>(h / L)), s));
  }
}

extern "C" {
void embed_fp32_f32(const float *row, float *out, int32 group, float scale) {
  (void)group;
  xdna::set_numerics();
  for (unsigned i = 0; i < EMB_H; i += L) {
    vf x = aie::load_v<L>(row + i);
    aie::store_v(out + i, scale == 1.0f ? x : xdna::fmul(x, scale));
  }
}

void embed_bf16_f32(const uint8 *row, float *out, int32 group, float scale) {
  (void)group;
  const bfloat16 *w = reinterpret_cast<const bfloat16 *>(row);
  xdna::set_numerics();
  const vf s = scale_bf16(scale);
  for (unsigned i = 0; i < EMB_H; i += L)
    aie::store_v(out + i, xdna::bmul(xdna::to_f32(aie::load_v<L>(w + i)), s));
}

void embed_int8_f32(const uint8 *row, float *out, int32 group, float scale) {
  embed_q<false>(row, out, group, scale);
}

void embed_int4_f32(const uint8 *row, float *out, int32 group, float scale) {
  embed_q<true>(row, out, group, scale);
}
}
