// Weight dequantization on the core (shared by gemv_q.cc and dequant.cc): 32 consecutive weights
// of one row, int8 or int4 (two per byte, element 2i in the low nibble: quant.pack_int4), widened
// int4 -> int8 -> int16 -> bf16 (exact) and multiplied by their group's bf16 scale, the product
// rounded to bf16 by the current mode (round to nearest even after set_numerics): that is
// numerics.bf16_round(q * scale), GemmDesign's weight-only operand.
#pragma once

#include "xdna_vec.h"

namespace xdna {

constexpr unsigned QV = 32;   // weights per dequantized chunk

template <bool INT4>
inline aie::vector<bfloat16, QV> dequant_chunk(const uint8 *row, unsigned k, bfloat16 scale) {
  aie::vector<int8, QV> q;
  if constexpr (INT4) q = aie::unpack(aie::load_v<QV>(reinterpret_cast<const int4 *>(row + k / 2)));
  else q = aie::load_v<QV>(reinterpret_cast<const int8 *>(row + k));
  aie::vector<bfloat16, QV> qf = aie::to_float<bfloat16>(aie::unpack(q), 0);
  return aie::mul(qf, scale).to_vector<bfloat16>();
}

}  // namespace xdna
