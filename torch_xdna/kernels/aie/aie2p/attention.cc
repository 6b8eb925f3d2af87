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

#include <cstring>

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

// S = scale * Q K^T for a TQ x TKV tile (K given as TKV rows of D), soft-capped, masked: key
// kpos = k_pos0 + column is hidden when kpos >= kv_valid, or (causal) kpos > qpos, or (window)
// kpos <= qpos - window, where qpos = q_base + (row % q_mod).
static void score_tile(const bfloat16 *q, const bfloat16 *k, float *s, float scale, int q_base,
                       int q_mod, int k_pos0, int kv_valid, int causal, int window, float softcap) {
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
        const int qpos = q_base + (z + e / 8) % q_mod, kpos = k_pos0 + j + e % 8;
        const bool past = kpos >= kv_valid;
        const bool future = causal && kpos > qpos;
        const bool old = window > 0 && kpos <= qpos - window;
        if (past || future || old) v.set(ninf, e);
      }
      store_4x8(s, ATT_TKV, z, j, v);
    }
}

// Online-softmax step on a score tile: m' = max(m, rowmax S); P = bf16(exp(S - m'));
// l = l e^(m - m') + sum(P) (the fp32 exps, or the bf16 P when sum_rounded); O *= e^(m - m').
// m and l of row r sit at m[r * stride] and l[r * stride].
static void online_update(const float *s, bfloat16 *p, float *m, float *l, int stride, float *o,
                          bool sum_rounded) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < ATT_TQ; ++r) {
    const float *sr = s + r * ATT_TKV;
    bfloat16 *pr = p + r * ATT_TKV;
    float &mr = m[r * stride], &lr = l[r * stride];
    const float m_new = std::max(mr, xdna::row_max(sr, ATT_TKV));
    if (m_new == ninf) {                       // nothing visible yet: P = 0, state unchanged
      for (int i = 0; i < ATT_TKV; i += L) aie::store_v(pr + i, aie::zeros<bfloat16, L>());
      continue;
    }
    const float alpha = exp_scalar(mr - m_new);
    vf acc = aie::zeros<float, L>();
    for (int i = 0; i < ATT_TKV; i += L) {
      vf e = xdna::exp_f32(aie::sub(aie::load_v<L>(sr + i), m_new));
      auto pb = xdna::to_bf16(e);
      acc = aie::add(acc, sum_rounded ? xdna::to_f32(pb) : e);
      aie::store_v(pr + i, pb);
    }
    lr = lr * alpha + aie::reduce_add(acc);
    mr = m_new;
    for (int i = 0; i < ATT_D; i += L)
      aie::store_v(o + r * ATT_D + i, xdna::fmul(aie::load_v<L>(o + r * ATT_D + i), alpha));
  }
}

// O += P V (P: TQ x TKV bf16, V: TKV rows of D). V rows at or past `v_valid` read as zero:
// a whole key tile read from a resident cache holds stale rows there (whatever an earlier
// sequence left, possibly not finite), and their P is 0, so they must add exactly nothing.
static void pv_tile(const bfloat16 *p, const bfloat16 *v, float *o, int v_valid = ATT_TKV) {
  for (int z = 0; z < ATT_TQ; z += 4)
    for (int j = 0; j < ATT_D; j += 8) {
      MMUL c(block_4x8(o, ATT_D, z, j));
      for (int kk = 0; kk < ATT_TKV; kk += 8) {
        aie::vector<bfloat16, 64> vb = block_8x8(v, ATT_D, kk, j);
        for (int e = 0; e < 64; ++e)
          if (kk + e / 8 >= v_valid) vb.set(bfloat16(0.0f), e);
        c.mac(block_4x8(p, ATT_TKV, z, kk), vb);
      }
      store_4x8(o, ATT_D, z, j, c.to_vector<float>());
    }
}

// Keys of tile j that lie before kv_len (0..TKV): the rows of V the tile may use.
static inline int tile_valid(int j, int kv_len) {
  return std::max(0, std::min(ATT_TKV, kv_len - j * ATT_TKV));
}

// out = O / l per row as O * (1 / l); a row with l == 0 (fully masked) gives 0.
static void finalize(const float *o, const float *l, int stride, float *out) {
  for (int r = 0; r < ATT_TQ; ++r) {
    const float inv = l[r * stride] > 0.0f ? aie::inv(l[r * stride]) : 0.0f;
    for (int i = 0; i < ATT_D; i += L)
      aie::store_v(out + r * ATT_D + i, xdna::fmul(aie::load_v<L>(o + r * ATT_D + i), inv));
  }
}

extern "C" {

void attn_qk_bf16_f32(const bfloat16 *q, const bfloat16 *k, float *s, float scale, int32 q_pos0,
                      int32 k_pos0, int32 kv_valid, int32 causal, int32 window, float softcap) {
  xdna::set_numerics();
  score_tile(q, k, s, scale, q_pos0, 1 << 30, k_pos0, kv_valid, causal, window, softcap);
}

void attn_online_softmax_f32(const float *s, bfloat16 *p, float *m, float *l, float *o) {
  xdna::set_numerics();
  online_update(s, p, m, l, 1, o, false);
}

void attn_pv_bf16_f32(const bfloat16 *p, const bfloat16 *v, float *o) {
  xdna::set_numerics();
  pv_tile(p, v, o);
}

void attn_finalize_f32(const float *o, const float *l, float *out) {
  xdna::set_numerics();
  finalize(o, l, 1, out);
}

// ---- the array IR's attention work-item kernels (kernels/lower/attention.py) -------------------
// Per work item: attn_init_f32, attn_q_bf16, one attn_tile_bf16 per key tile, attn_finish_f32.
// ml is [rows, 2] (running max, running sum), state i32[2] = (key tile counter, work item
// counter); kv is one (2, TKV, D) element [K tile | V tile] (attn_q_bf16 reads Q from the item's
// first element). Keys at or past kv_len are masked and their V rows read as zero, so a key tile
// may be read whole from a resident cache whatever its stale rows hold. Query row r is position q_offset + t0 + r % tq, t0 the item's first query
// (item w = state[1] * cores + core, tile w % q_tiles). The running sum adds the bf16 P.
void attn_init_f32(float *o, float *ml, int32 *state) {
  for (int i = 0; i < ATT_TQ * ATT_D; i += L) aie::store_v(o + i, aie::zeros<float, L>());
  for (int r = 0; r < ATT_TQ; ++r) {
    ml[2 * r] = -std::numeric_limits<float>::infinity();
    ml[2 * r + 1] = 0.0f;
  }
  state[0] = 0;
}

void attn_q_bf16(const bfloat16 *kv, bfloat16 *q, int32 *state) {
  (void)state;
  for (int i = 0; i < ATT_TQ * ATT_D; i += L) aie::store_v(q + i, aie::load_v<L>(kv + i));
}

void attn_tile_bf16(const bfloat16 *q, const bfloat16 *kv, float *s, bfloat16 *p, float *o,
                    float *ml, int32 *state, int32 kv_len, int32 q_offset, float scale, int32 core,
                    int32 cores, int32 q_tiles, int32 tq, int32 group, int32 causal, int32 window,
                    float softcap) {
  (void)group;
  xdna::set_numerics();
  const int j = state[0]++;
  const int w = state[1] * cores + core;
  const int t0 = (w % q_tiles) * tq;
  score_tile(q, kv, s, scale, q_offset + t0, tq, j * ATT_TKV, kv_len, causal, window, softcap);
  online_update(s, p, ml, ml + 1, 2, o, true);
  pv_tile(p, kv + ATT_TKV * ATT_D, o, tile_valid(j, kv_len));
}

// Masked designs (AttentionDesign mask=True): the element is bytes [K tile | V tile | mask tile],
// the mask tile ATT_TQ x ATT_TKV after the two bf16 tiles: mask_kind 1 = fp32 additive (added to
// the masked scores), 2 = bool bytes (0 hides the key: -inf). attn_q_masked_bf16 reads Q from the
// first element's bytes as attn_q_bf16 does.
void attn_q_masked_bf16(const uint8_t *kvm, bfloat16 *q, int32 *state) {
  attn_q_bf16(reinterpret_cast<const bfloat16 *>(kvm), q, state);
}

void attn_tile_masked_bf16(const bfloat16 *q, const uint8_t *kvm, float *s, bfloat16 *p, float *o,
                           float *ml, int32 *state, int32 kv_len, int32 q_offset, float scale,
                           int32 core, int32 cores, int32 q_tiles, int32 tq, int32 group,
                           int32 causal, int32 window, float softcap, int32 mask_kind) {
  (void)group;
  xdna::set_numerics();
  const bfloat16 *kv = reinterpret_cast<const bfloat16 *>(kvm);
  const uint8_t *mt = kvm + 2 * ATT_TKV * ATT_D * sizeof(bfloat16);
  const int j = state[0]++;
  const int w = state[1] * cores + core;
  const int t0 = (w % q_tiles) * tq;
  score_tile(q, kv, s, scale, q_offset + t0, tq, j * ATT_TKV, kv_len, causal, window, softcap);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < ATT_TQ * ATT_TKV; ++i) {
    if (mask_kind == 1) {
      float m;
      std::memcpy(&m, mt + 4 * i, sizeof m);
      s[i] = s[i] + m;
    } else if (mask_kind == 2 && mt[i] == 0) {
      s[i] = ninf;
    }
  }
  online_update(s, p, ml, ml + 1, 2, o, true);
  pv_tile(p, kv + ATT_TKV * ATT_D, o, tile_valid(j, kv_len));
}

void attn_finish_f32(float *o, const float *ml, int32 *state) {
  xdna::set_numerics();
  finalize(o, ml + 1, 2, o);
  state[1] += 1;
}

}  // extern "C"
