// Weight dequantization on the core (wq.cc): 32 consecutive weights of one row, int8 or int4 (two
// per byte, element 2i in the low nibble: quant.pack_int4), widened int4 -> int8 -> int16 -> bf16
// (exact) and multiplied by their group's bf16 scale, the product rounded to bf16 by the current
// mode (round to nearest even after set_numerics): numerics.bf16_round(q * scale), GemmDesign's
// weight-only operand.
#pragma once

#include "xdna_vec.h"

namespace xdna {

constexpr unsigned QV = 32;   // weights per dequantized chunk

// Scales of weights [k, k + 32) of a row whose scales start at `s`, groups of g (> 0).
inline aie::vector<bfloat16, QV> chunk_scales(const bfloat16 *s, unsigned k, unsigned g) {
  if (k / g == (k + QV - 1) / g) return aie::broadcast<bfloat16, QV>(s[k / g]);
  aie::vector<bfloat16, QV> v;
  for (unsigned i = 0; i < QV; ++i) v.set(s[(k + i) / g], i);
  return v;
}

template <bool INT4>
inline aie::vector<bfloat16, QV> dequant_chunk(const uint8 *row, unsigned k,
                                               const aie::vector<bfloat16, QV> &scale) {
  aie::vector<int8, QV> q;
  if constexpr (INT4) q = aie::unpack(aie::load_v<QV>(reinterpret_cast<const int4 *>(row + k / 2)));
  else q = aie::load_v<QV>(reinterpret_cast<const int8 *>(row + k));
  aie::vector<bfloat16, QV> qf = aie::to_float<bfloat16>(aie::unpack(q), 0);
  return aie::mul(qf, scale).to_vector<bfloat16>();
}

}  // namespace xdna
