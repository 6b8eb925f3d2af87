// Rotary embedding (rotate-half convention) for AIE2P: for `rows` rows (heads) of d bf16 values
// at one position, out = x * cos + roll(x, d/2) * signed_sin, with cos and signed_sin (sin with
// its first half negated) one bf16 row of d, as llm_blocks._rope. Products of bf16 operands are
// exact, so each output is one rounded fp32 add: bit-exact with llm_blocks._rope.
#include "xdna_vec.h"

using xdna::L;
using xdna::vf;

extern "C" void rope_bf16_f32(const bfloat16 *x, const bfloat16 *cos, const bfloat16 *ssin,
                              float *out, int32 rows, int32 d) {
  xdna::set_numerics();
  const int h = d / 2;
  for (int r = 0; r < rows; ++r) {
    const bfloat16 *xr = x + r * d;
    float *yr = out + r * d;
    for (int half = 0; half < 2; ++half) {        // first half pairs with x[h:], second with x[:h]
      const int base = half * h, other = (1 - half) * h;
      for (int i = 0; i < h; i += L) {
        vf a = xdna::fmul(xdna::load_f32(xr + base, i, h), xdna::load_f32(cos + base, i, h));
        vf b = xdna::fmul(xdna::load_f32(xr + other, i, h), xdna::load_f32(ssin + base, i, h));
        xdna::store_part(yr + base, i, h, aie::add(a, b));
      }
    }
  }
}
