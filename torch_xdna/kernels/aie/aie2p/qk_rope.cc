// The fused decoder layer's q/k stage for AIE2P (kernels/lower/llm_layer.py): per token, its q
// heads then its k heads (`rows` rows of d bf16 values), each RMS-normalized with its own weight
// row (q_norm for q heads, k_norm for k heads: w [rows, d], the per-head QK-norm of Qwen3),
// rounded to bf16, then rotated (rotate-half RoPE) by the token's cos / signed_sin rows, which
// ride in the same element after the heads: xcs = [rows x d | cos d | signed_sin d]; the result
// is rounded to bf16:
//   out = bf16(rope(bf16(rms(x) * (w + offset))))            (llm_blocks._rms, llm_blocks._rope)
// Without q/k norm the lowering calls rope only (rope.cc). work: 2 x d fp32 (the widened input
// row, then the normalized row). Golden: golden.qk_norm_rope (bit-exact).
#include "xdna_row.h"

using xdna::L;
using xdna::vf;

extern "C" void qk_norm_rope_bf16(const bfloat16 *xcs, const bfloat16 *w, bfloat16 *out,
                                  float *work, int32 rows, int32 d, float eps, float offset) {
  xdna::set_numerics();
  const bfloat16 *cos = xcs + rows * d;
  const bfloat16 *ssin = cos + d;
  float *nrm = work + d;
  const int h = d / 2;
  for (int r = 0; r < rows; ++r) {
    const xdna::Row<bfloat16> x(xcs + r * d, work, d);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < d; i += L) {
      vf v = x(i);
      acc = aie::add(acc, xdna::fmul(v, v));
    }
    const float rstd = aie::invsqrt(aie::reduce_add(acc) / float(d) + eps);
    const bfloat16 *wr = w + r * d;
    for (int i = 0; i < d; i += L) {
      vf o = xdna::fmul(xdna::fmul(x(i), rstd), aie::add(xdna::load_operand(wr, i, d), offset));
      xdna::store_part(nrm, i, d, xdna::to_f32(xdna::to_bf16(o)));     // the bf16 operand
    }
    bfloat16 *yr = out + r * d;
    for (int half = 0; half < 2; ++half) {        // first half pairs with x[h:], second with x[:h]
      const int base = half * h, other = (1 - half) * h;
      for (int i = 0; i < h; i += L) {
        vf a = xdna::fmul(xdna::load_f32(nrm + base, i, h), xdna::load_f32(cos + base, i, h));
        vf b = xdna::fmul(xdna::load_f32(nrm + other, i, h), xdna::load_f32(ssin + base, i, h));
        xdna::store_part(yr + base, i, h, aie::add(a, b));
      }
    }
  }
}

// Layers without q/k norm (Llama, SmolLM2): the same stage, rope only on the bf16 heads:
//   out = bf16(rope(x))                                                       (llm_blocks._rope)
// xcs as above. Golden: golden.qk_rope (bit-exact).
extern "C" void qk_rope_bf16(const bfloat16 *xcs, bfloat16 *out, int32 rows, int32 d) {
  xdna::set_numerics();
  const bfloat16 *cos = xcs + rows * d;
  const bfloat16 *ssin = cos + d;
  const int h = d / 2;
  for (int r = 0; r < rows; ++r) {
    const bfloat16 *xr = xcs + r * d;
    bfloat16 *yr = out + r * d;
    for (int half = 0; half < 2; ++half) {
      const int base = half * h, other = (1 - half) * h;
      for (int i = 0; i < h; i += L) {
        vf a = xdna::fmul(xdna::load_f32(xr + base, i, h), xdna::load_f32(cos + base, i, h));
        vf b = xdna::fmul(xdna::load_f32(xr + other, i, h), xdna::load_f32(ssin + base, i, h));
        xdna::store_part(yr + base, i, h, aie::add(a, b));
      }
    }
  }
}
