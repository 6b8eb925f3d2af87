// Attention inner blocks for AIE2P (flash style, as AttentionDesign maps it): one core holds a
// tile of ATT_TQ query rows, streams K/V in tiles of ATT_TKV keys of head dim ATT_D, keeps the
// running max m, sum l and output accumulator O in fp32, and P in bf16 for the P @ V mmul.
// Per KV tile the core body calls:
//   attn_qk_bf16_f32          S = scale * Q K^T, soft-capped (softcap * tanh(S / softcap)) if
//                             softcap > 0, masked to -inf: keys at or past kv_valid, future keys
//                             (causal), keys outside a sliding window of `window` (> 0)
//   attn_online_softmax_f32   m' = max(m, rowmax S); P = exp(S - m') (bf16); l = l e^(m-m') + sum P;
//                             O *= e^(m - m')
//   attn_pv_bf16_f32          O += P V
// and once at the end attn_finalize_f32 (out = O / l; a row with l == 0, fully masked, gives 0).
// Q, K, V, S, P and O are row-major; the mmul blocks (4x8x8 bf16) are assembled in registers.
// Golden: golden.attention_flash (the same tile loop, bit-exact); attention.attention_reference
// within the bound docs/kernels.md states.
#include "xdna_vec.h"

#ifndef ATT_TQ
#define ATT_TQ 8
#endif
#ifndef ATT_TKV
#define ATT_TKV 32
#endif
#ifndef ATT_D
#define ATT_D 64
#endif

static_assert(ATT_TQ % 4 == 0 && ATT_TKV % 16 == 0 && ATT_D % 16 == 0,
              "attention tiles: TQ multiple of 4, TKV and D of 16");

using MMUL = aie::mmul<4, 8, 8, bfloat16, bfloat16>;
using xdna::L;
using xdna::vf;

// Rows [r0, r0+4) x columns [c0, c0+8) of a row-major bf16 matrix with `ld` columns.
template <typename T>
static inline aie::vector<T, 32> block_4x8(const T *p, int ld, int r0, int c0) {
  return aie::concat(aie::load_v<8>(p + (r0 + 0) * ld + c0), aie::load_v<8>(p + (r0 + 1) * ld + c0),
                     aie::load_v<8>(p + (r0 + 2) * ld + c0), aie::load_v<8>(p + (r0 + 3) * ld + c0));
}
static inline aie::vector<bfloat16, 64> block_8x8(const bfloat16 *p, int ld, int r0, int c0) {
  return aie::concat(block_4x8(p, ld, r0, c0), block_4x8(p, ld, r0 + 4, c0));
}
static inline void store_4x8(float *p, int ld, int r0, int c0, const aie::vector<float, 32> &v) {
  for (int i = 0; i < 4; ++i) aie::store_v(p + (r0 + i) * ld + c0, v.extract<8>(i));
}

static inline float exp_scalar(float x) { return xdna::exp_f32(aie::broadcast<float, L>(x))[0]; }

extern "C" {

void attn_qk_bf16_f32(const bfloat16 *q, const bfloat16 *k, float *s, float scale, int32 q_pos0,
                      int32 k_pos0, int32 kv_valid, int32 causal, int32 window, float softcap) {
  xdna::set_numerics();
  const float ninf = -std::numeric_limits<float>::infinity();
  const float inv_cap = softcap > 0.0f ? aie::inv(softcap) : 0.0f;
  for (int z = 0; z < ATT_TQ; z += 4)
    for (int j = 0; j < ATT_TKV; j += 8) {
      MMUL c(aie::zeros<float, 32>());
      for (int d = 0; d < ATT_D; d += 8)       // B block = (8 keys x 8 dims)^T
        c.mac(block_4x8(q, ATT_D, z, d), aie::transpose(block_8x8(k, ATT_D, j, d), 8, 8));
      aie::vector<float, 32> v = aie::mul(c.to_vector<float>(), scale).to_vector<float>();
      if (softcap > 0.0f)
        for (int h = 0; h < 2; ++h) {
          vf t = xdna::tanh_f32(xdna::fmul(v.extract<16>(h), inv_cap));
          vf capped = xdna::fmul(t, softcap);
          for (unsigned e = 0; e < L; ++e) v.set(capped[e], h * L + e);
        }
      for (int e = 0; e < 32; ++e) {
        const int qpos = q_pos0 + z + e / 8, kpos = k_pos0 + j + e % 8;
        const bool past = kpos >= kv_valid;
        const bool future = causal && kpos > qpos;
        const bool old = window > 0 && kpos <= qpos - window;
        if (past || future || old) v.set(ninf, e);
      }
      store_4x8(s, ATT_TKV, z, j, v);
    }
}

void attn_online_softmax_f32(const float *s, bfloat16 *p, float *m, float *l, float *o) {
  xdna::set_numerics();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < ATT_TQ; ++r) {
    const float *sr = s + r * ATT_TKV;
    bfloat16 *pr = p + r * ATT_TKV;
    const float m_new = std::max(m[r], xdna::row_max(sr, ATT_TKV));
    if (m_new == ninf) {                       // nothing visible yet: P = 0, state unchanged
      for (int i = 0; i < ATT_TKV; i += L) aie::store_v(pr + i, aie::zeros<bfloat16, L>());
      continue;
    }
    const float alpha = exp_scalar(m[r] - m_new);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < ATT_TKV; i += L) {
      vf e = xdna::exp_f32(aie::sub(aie::load_v<L>(sr + i), m_new));
      acc = aie::add(acc, e);
      aie::store_v(pr + i, xdna::to_bf16(e));
    }
    l[r] = l[r] * alpha + aie::reduce_add(acc);
    m[r] = m_new;
    for (int i = 0; i < ATT_D; i += L)
      aie::store_v(o + r * ATT_D + i, xdna::fmul(aie::load_v<L>(o + r * ATT_D + i), alpha));
  }
}

void attn_pv_bf16_f32(const bfloat16 *p, const bfloat16 *v, float *o) {
  xdna::set_numerics();
  for (int z = 0; z < ATT_TQ; z += 4)
    for (int j = 0; j < ATT_D; j += 8) {
      MMUL c(block_4x8(o, ATT_D, z, j));
      for (int kk = 0; kk < ATT_TKV; kk += 8)
        c.mac(block_4x8(p, ATT_TKV, z, kk), block_8x8(v, ATT_D, kk, j));
      store_4x8(o, ATT_D, z, j, c.to_vector<float>());
    }
}

void attn_finalize_f32(const float *o, const float *l, float *out) {
  xdna::set_numerics();
  for (int r = 0; r < ATT_TQ; ++r) {
    const float inv = l[r] > 0.0f ? aie::inv(l[r]) : 0.0f;
    for (int i = 0; i < ATT_D; i += L)
      aie::store_v(out + r * ATT_D + i, xdna::fmul(aie::load_v<L>(o + r * ATT_D + i), inv));
  }
}

}  // extern "C"
