// Host emulation of the AIE API (aie_api) subset used by torch_xdna/kernels/aie/aie2p/*.cc.
//
// This is NOT AMD's aie_api: it is a small, independent model of exactly the types and
// functions our core kernels call, so the same kernel sources compile with g++ and run against
// the project's Python numerics. Each function says what semantics it implements and where they
// come from. Sources (named once):
//   [API-types]  AIE API User Guide, "Basic Types" (vector / accum, native sizes on XDNA 2):
//                https://xilinx.github.io/aie_api/group__group__basic__types.html
//   [API-mmul]   AIE API User Guide, "Matrix Multiplication" (aie::mmul, tiled row-major A MxK,
//                B KxN, C MxN; mul / mac; AIE2P shapes 4x8x8 bf16, 8x8x8 int8):
//                https://xilinx.github.io/aie_api/group__group__mmul.html
//   [API-conv]   AIE API User Guide, "Floating-point Conversion" (to_float / to_fixed):
//                https://docs.amd.com/r/2024.2-English/AI-Engine-API-User-Guide-AIE-UG1529/Floating-point-Conversion
//   [API-arith]  AIE API User Guide, "Arithmetic", "Reduction", "Comparison", "Reshaping",
//                "Elementary Functions" (add/sub/mul/mac/neg/max/min, reduce_add/reduce_max,
//                lt/select, concat/transpose, inv/invsqrt): https://xilinx.github.io/aie_api/topics.html
//   [INTR-rnd]   AI Engine Intrinsics, rounding modes and their register values (rnd_floor 0 =
//                truncate toward -inf, ..., rnd_conv_even 6 = round half to even):
//                https://www.xilinx.com/htmldocs/xilinx2022_2/aiengine_intrinsics/intrinsics/group__intr__gpvectorop__mode.html
//   [AM020]      AMD AM020 AIE-ML architecture manual: the float path flushes denormals to zero.
//   [MLIR-AIE]   Xilinx/mlir-aie aie_kernels/aie2p/mm.cc (mmul usage, zero + mac into C),
//                mm_bfp.cc / mm_bfp_mixed.cc (bfp16ebs8 block vectors, accum -> bfp16 conversion,
//                mac_8x8_8x8T with B transposed), python/utils/bfp.py (bfp16 block encoding).
//   [UG1603-align] AMD UG1603, "Alignment": load_v/store_v need the vector's own alignment
//                (128-bit on 128 bits, 256 on 256, 512-bit on 512 bits on AIE-ML v2);
//                load_unaligned_v/store_unaligned_v only the element's:
//                https://docs.amd.com/r/en-US/ug1603-ai-engine-ml-kernel-graph/Alignment
//   [UG1603-fp]  AMD UG1603 AIE-ML kernel guide, "Floating-Point Operations" (fp32 via bf16):
//                https://docs.amd.com/r/en-US/ug1603-ai-engine-ml-kernel-graph/Floating-Point-Operations
//   [NUMERICS]   torch_xdna/kernels/numerics.py and quant.py (the project's documented numerics).
//
// Deliberate modelling choices (documented in docs/kernels.md):
//  * fp32 vector arithmetic (add, sub, mul of floats, accumulator adds) is IEEE binary32 with
//    round-to-nearest-even, one rounding per operation, evaluated in a fixed order. Kernels are
//    built with -ffp-contract=off so g++ never fuses a multiply and an add. AIE-ML v2 has no
//    fp32 multiplier: the AIE API emulates float x float with bf16 products [UG1603-fp]; the
//    emulation models that (3-way bf16 split, 9 products, "accuracy safe": mul below).
//  * bf16 x bf16 (and bfp16 mantissa) products are exact in fp32, so mac == one rounded add.
//  * Subnormals are flushed at the bf16 boundary (conversion to and from bfloat16), as
//    numerics.operand does [NUMERICS][AM020]; fp32 accumulator arithmetic keeps IEEE subnormals.
//  * Rounding of float -> bf16 conversions follows the core's rounding mode register [INTR-rnd];
//    its reset value is floor (truncate toward -inf), the hardware default numerics.py documents;
//    kernels set conv_even, as numerics.py says AIE2P kernels do.
//  * Reductions (reduce_add / reduce_max) combine lanes pairwise by halving: lane i with lane
//    i + N/2, repeatedly. The real tree may differ; our goldens follow this order.
//  * aie::inv is the correctly rounded 1/x; aie::invsqrt is 1/sqrt(x) with two roundings. The
//    hardware's may be less accurate (not verified here: no NPU on this host).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

// ---- scalar element types ----------------------------------------------------------------
using int8 = int8_t;
using uint8 = uint8_t;
using int16 = int16_t;
using int32 = int32_t;
using uint32 = uint32_t;
using int64 = int64_t;

namespace aie {
enum class rounding_mode : unsigned {   // values as the rnd_* intrinsic constants [INTR-rnd]
  floor = 0, ceil = 1, positive_inf = 2, negative_inf = 3, symmetric_inf = 4,
  symmetric_zero = 5, conv_even = 6, conv_odd = 7
};
namespace detail {
inline rounding_mode &rounding_register() {      // one core's mode register (reset: floor,
                                                  // per numerics.py; one per host thread)
  static thread_local rounding_mode mode = rounding_mode::floor;
  return mode;
}
inline float bits_to_float(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }
// fp32 -> bf16 bits under a rounding mode; subnormal results flush to signed zero [AM020].
inline uint16_t f32_to_bf16_bits(float f, rounding_mode mode) {
  uint32_t b = float_to_bits(f);
  if (std::isnan(f)) return uint16_t((b >> 16) | 0x40);            // quiet NaN
  if ((b & 0x7F800000u) == 0) return uint16_t((b >> 16) & 0x8000);  // fp32 subnormal / zero
  uint32_t hi = b >> 16, lo = b & 0xFFFFu;           // sign-magnitude: round the magnitude
  bool neg = b >> 31;
  if (std::isinf(f)) return uint16_t(hi);
  bool up = false;
  if (mode == rounding_mode::floor) up = neg && lo;  // no rounding: truncate toward -inf
  else if (mode == rounding_mode::ceil) up = !neg && lo;
  else if (lo != 0x8000u) up = lo > 0x8000u;         // round to nearest; ties by mode:
  else switch (mode) {
    case rounding_mode::positive_inf: up = !neg; break;
    case rounding_mode::negative_inf: up = neg; break;
    case rounding_mode::symmetric_inf: up = true; break;
    case rounding_mode::symmetric_zero: up = false; break;
    case rounding_mode::conv_even: up = hi & 1u; break;
    default: up = !(hi & 1u); break;                  // conv_odd
  }
  hi += up;
  if ((hi & 0x7F80u) == 0) hi &= 0x8000u;                          // rounded into subnormal
  return uint16_t(hi);
}
}  // namespace detail

inline void set_rounding(rounding_mode m) { detail::rounding_register() = m; }
inline rounding_mode get_rounding() { return detail::rounding_register(); }
}  // namespace aie

// bfloat16 storage type: 1 sign, 8 exponent, 7 mantissa bits. Conversion from float uses the
// current rounding mode; conversion to float is exact except subnormals, which read as zero.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f) : bits(aie::detail::f32_to_bf16_bits(f, aie::get_rounding())) {}
  operator float() const {
    uint16_t b = (bits & 0x7F80u) == 0 ? uint16_t(bits & 0x8000u) : bits;
    return aie::detail::bits_to_float(uint32_t(b) << 16);
  }
};
static_assert(sizeof(bfloat16) == 2, "bfloat16 must be 2 bytes");

// int4: a 4-bit two's-complement lane. In memory two share a byte, element 2i in the low nibble
// of byte i (as quant.pack_int4), and an int4 pointer advances in bytes (mlir-aie's aie2 expand.cc
// steps its int4 pointer by vec/2 per vec-element load). On the host a lane holds its value.
struct int4 { int8_t value; };

// Accumulator tags [API-types] (acc64 and the others exist in aie_api; our kernels use these).
struct accfloat {};
struct acc32 {};
struct accauto {};
// bfp16ebs8 element tag: 8 values share one 8-bit exponent, 8-bit two's-complement mantissas,
// 9 bytes per block in memory: [exponent, m0..m7] [MLIR-AIE bfp.py][NUMERICS quant.py].
struct bfp16ebs8 { uint8_t bytes[9]; };

namespace aie {

// ---- vector ---------------------------------------------------------------------------------
// aie::vector<T, N>: N lanes of T [API-types]. Lanes are held unpacked on the host.
template <typename T, unsigned N>
struct vector {
  // 128/256/512/1024-bit vectors are native, larger ones multiples of 512 bits [API-types]
  static constexpr unsigned bits = (std::is_same_v<T, ::int4> ? 4 : 8 * sizeof(T)) * N;
  static_assert(bits == 128 || bits == 256 || bits == 512 || (bits >= 1024 && bits % 512 == 0),
                "aie::vector: 128, 256, 512, 1024 bits or a multiple of 512 (AIE API basic types)");
  using value_type = T;
  std::array<T, N> v{};
  static constexpr unsigned size() { return N; }
  T get(unsigned i) const { return v[i]; }
  T operator[](unsigned i) const { return v[i]; }
  vector &set(T x, unsigned i) { v[i] = x; return *this; }
  template <unsigned M>
  vector<T, M> extract(unsigned idx) const {       // sub-vector idx of size M
    static_assert(N % M == 0, "extract: size must divide the vector");
    vector<T, M> r;
    for (unsigned i = 0; i < M; ++i) r.v[i] = v[idx * M + i];
    return r;
  }
};

// ---- accumulator ----------------------------------------------------------------------------
template <typename Tag> struct acc_storage;
template <> struct acc_storage<accfloat> { using type = float; };
template <> struct acc_storage<acc32> { using type = int32_t; };
template <typename T> struct is_acc_tag : std::false_type {};
template <> struct is_acc_tag<accfloat> : std::true_type {};
template <> struct is_acc_tag<acc32> : std::true_type {};

template <typename Tag, unsigned N> struct accum;
template <typename T, unsigned N> struct block_vector;

namespace detail {
inline int32_t wrap32(int64_t x) { return int32_t(uint32_t(uint64_t(x))); }
template <typename Tag, typename Elem>
typename acc_storage<Tag>::type to_acc(Elem x) {
  if constexpr (std::is_same_v<Tag, accfloat>) return float(x);
  else return typename acc_storage<Tag>::type(x);
}
template <typename T> T from_float(float f) {
  if constexpr (std::is_same_v<T, bfloat16>) return bfloat16(f);   // current rounding mode
  else return f;
}
}  // namespace detail

// aie::accum<Tag, N>: wide lanes (fp32 for accfloat, 32/64-bit ints for acc32/acc64) [API-types].
// acc32 lanes wrap modulo 2^32 (a model choice; our kernels stay in range).
template <typename Tag, unsigned N>
struct accum {
  using S = typename acc_storage<Tag>::type;
  std::array<S, N> v{};
  static constexpr unsigned size() { return N; }
  accum() = default;
  template <typename E>
  accum(const vector<E, N> &x) { from_vector(x); }            // loads a vector into the acc
  template <typename E>
  accum &from_vector(const vector<E, N> &x) {
    for (unsigned i = 0; i < N; ++i) {
      if constexpr (std::is_same_v<Tag, accfloat>) v[i] = float(x.v[i]);
      else v[i] = S(x.v[i]);
    }
    return *this;
  }
  // to_vector<T>(): float lanes -> float (exact) or bfloat16 (current rounding mode, FTZ);
  // integer lanes -> int32 (shift 0 only: our kernels keep int32 results).
  template <typename T>
  auto to_vector(int shift = 0) const {
    if constexpr (std::is_same_v<T, bfp16ebs8>) {
      return to_block_vector();
    } else {
      vector<T, N> r;
      for (unsigned i = 0; i < N; ++i) {
        if constexpr (std::is_same_v<Tag, accfloat>) r.v[i] = detail::from_float<T>(v[i]);
        else {
          if (shift != 0) {                   // srs with a shift: not modelled (unused)
            std::fprintf(stderr, "aie emulation: accum::to_vector shift %d unsupported\n", shift);
            std::abort();
          }
          r.v[i] = T(v[i]);
        }
      }
      return r;
    }
  }
  block_vector<bfp16ebs8, N> to_block_vector() const;
};

// ---- bfp16ebs8 block vectors ----------------------------------------------------------------
// block_vector<bfp16ebs8, N>: N/8 blocks, each a shared biased exponent and 8 int8 mantissas;
// value = m * 2^(e - 133) [NUMERICS quant.py][MLIR-AIE bfp.py]. Memory layout: 9-byte blocks.
template <unsigned N>
struct block_vector<bfp16ebs8, N> {
  static_assert(N % 8 == 0, "bfp16ebs8 vectors hold whole blocks of 8");
  std::array<uint8_t, N / 8> exp{};
  std::array<int8_t, N> mant{};
  float get(unsigned i) const {
    return std::ldexp(float(mant[i]), int(exp[i / 8]) - 133);
  }
};

// accum<accfloat, N> -> bfp16ebs8: per block of 8 lanes, e = max biased fp32 exponent, each
// mantissa = floor(x * 2^(133 - e)) clamped to int8; a negative value (even -0.0) 32+ binades
// below the block maximum becomes -1 LSB. Subnormals are flushed first. As quant.py documents.
template <typename Tag, unsigned N>
block_vector<bfp16ebs8, N> accum<Tag, N>::to_block_vector() const {
  static_assert(std::is_same_v<Tag, accfloat>, "bfp16 conversion needs an accfloat accum");
  block_vector<bfp16ebs8, N> r;
  for (unsigned b = 0; b < N / 8; ++b) {
    int ex[8], emax = 0;
    float x[8];
    for (unsigned j = 0; j < 8; ++j) {
      x[j] = v[b * 8 + j];
      uint32_t bits = detail::float_to_bits(x[j]);
      if ((bits & 0x7F800000u) == 0) { x[j] = std::signbit(x[j]) ? -0.0f : 0.0f; bits &= 0x80000000u; }
      ex[j] = int((bits >> 23) & 0xFF);
      emax = std::max(emax, ex[j]);
    }
    r.exp[b] = uint8_t(emax);
    for (unsigned j = 0; j < 8; ++j) {
      double m = std::floor(std::ldexp(double(x[j]), 133 - emax));
      m = std::min(127.0, std::max(-128.0, m));
      if (std::signbit(x[j]) && emax - ex[j] >= 32) m = -1.0;
      r.mant[b * 8 + j] = int8_t(m);
    }
  }
  return r;
}

// block_vector_input_buffer_stream<bfp16ebs8, N>: reads consecutive N-value block vectors
// from memory (9-byte blocks); seek(n) skips n block vectors [MLIR-AIE mm_bfp.cc].
template <typename T, unsigned N> struct block_vector_input_buffer_stream;
template <unsigned N>
struct block_vector_input_buffer_stream<bfp16ebs8, N> {
  const uint8_t *p;
  explicit block_vector_input_buffer_stream(const bfp16ebs8 *ptr)
      : p(reinterpret_cast<const uint8_t *>(ptr)) {}
  void seek(int n) { p += std::ptrdiff_t(n) * (N / 8) * 9; }
  block_vector<bfp16ebs8, N> pop() {
    block_vector<bfp16ebs8, N> r;
    for (unsigned b = 0; b < N / 8; ++b, p += 9) {
      r.exp[b] = p[0];
      for (unsigned j = 0; j < 8; ++j) r.mant[b * 8 + j] = int8_t(p[1 + j]);
    }
    return r;
  }
};

// ---- initialization, memory -----------------------------------------------------------------
template <typename T, unsigned N>
auto zeros() {                                        // [API-arith] Initialization
  if constexpr (is_acc_tag<T>::value) return accum<T, N>{};
  else return vector<T, N>{};
}
template <typename T, unsigned N>
vector<T, N> broadcast(T x) {
  vector<T, N> r;
  r.v.fill(x);
  return r;
}
namespace detail {
// A misaligned aligned access is a kernel bug the hardware would not report (the data "might be
// unexpected" [UG1603-align]): the emulation stops the program with the address.
inline void check_aligned(const void *p, std::size_t bytes, const char *what) {
  const std::size_t need = bytes < 64 ? bytes : 64;
  if (reinterpret_cast<std::uintptr_t>(p) % need != 0) {
    std::fprintf(stderr, "aie emulation: %s of %zu bytes at %p is not %zu-byte aligned; use "
                 "load_unaligned_v/store_unaligned_v or align the buffer\n", what, bytes, p, need);
    std::abort();
  }
}
template <unsigned N, typename T>
vector<T, N> load_raw(const T *p) {
  vector<T, N> r;
  if constexpr (std::is_same_v<T, int4>) {      // N nibbles from N/2 bytes, low nibble first
    const uint8_t *b = reinterpret_cast<const uint8_t *>(p);
    for (unsigned i = 0; i < N; ++i) {
      int nib = (b[i / 2] >> ((i & 1) * 4)) & 0xF;
      r.v[i].value = int8(nib >= 8 ? nib - 16 : nib);
    }
  } else {
    std::memcpy(r.v.data(), p, sizeof(T) * N);
  }
  return r;
}
template <typename T, unsigned N> constexpr std::size_t vector_bytes() {
  return std::is_same_v<T, int4> ? N / 2 : sizeof(T) * N;
}
}  // namespace detail

// load_v<N>(p) / store_v(p, v): N consecutive elements, p aligned to the vector's size (at most
// 64 bytes) [API-types Memory][UG1603-align]; for int4, N nibbles from N/2 bytes.
template <unsigned N, typename T>
vector<T, N> load_v(const T *p) {
  detail::check_aligned(p, detail::vector_bytes<T, N>(), "load_v");
  return detail::load_raw<N>(p);
}
template <unsigned N, typename T>
vector<T, N> load_unaligned_v(const T *p) { return detail::load_raw<N>(p); }
template <typename T, unsigned N>
void store_v(T *p, const vector<T, N> &x) {
  static_assert(!std::is_same_v<T, int4>, "store_v of int4 lanes is not modelled");
  detail::check_aligned(p, sizeof(T) * N, "store_v");
  std::memcpy(p, x.v.data(), sizeof(T) * N);
}
template <typename T, unsigned N>
void store_unaligned_v(T *p, const vector<T, N> &x) {
  static_assert(!std::is_same_v<T, int4>, "store of int4 lanes is not modelled");
  std::memcpy(p, x.v.data(), sizeof(T) * N);
}

// ---- conversions ----------------------------------------------------------------------------
// to_float<bfloat16|float>(vector<int16|int32>, shift): x * 2^-shift, rounded by the current
// mode [API-conv]; exact for the |x| <= 128 our kernels convert.
template <typename TF, typename TI, unsigned N>
vector<TF, N> to_float(const vector<TI, N> &x, int shift = 0) {
  static_assert(std::is_same_v<TI, int16> || std::is_same_v<TI, int32>,
                "to_float: widen 4/8-bit lanes with unpack first (lanes stay in order)");
  vector<TF, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = detail::from_float<TF>(std::ldexp(float(x.v[i]), -shift));
  return r;
}
// to_fixed<int32>(vector<float>, shift): x * 2^shift to an integer under the current rounding
// mode [API-conv]; our kernels only convert integral values, where every mode agrees.
template <typename TI, unsigned N>
vector<TI, N> to_fixed(const vector<float, N> &x, int shift = 0) {
  vector<TI, N> r;
  for (unsigned i = 0; i < N; ++i) {
    float y = std::ldexp(x.v[i], shift);
    r.v[i] = TI(get_rounding() == rounding_mode::conv_even ? std::nearbyint(y) : std::floor(y));
  }
  return r;
}
// unpack(v): every lane widened to twice its bits, sign-extended (int4 -> int8 -> int16)
// [API-arith Reshaping / conversions; the idiom of mlir-aie's aie2 expand.cc].
template <unsigned N>
vector<int8, N> unpack(const vector<int4, N> &x) {
  vector<int8, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = x.v[i].value;
  return r;
}
template <unsigned N>
vector<int16, N> unpack(const vector<int8, N> &x) {
  vector<int16, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = x.v[i];
  return r;
}
// vector_cast<T>: reinterpret the lanes' bits (same total size) [API-types conversions].
template <typename TO, typename TI, unsigned N>
vector<TO, N * sizeof(TI) / sizeof(TO)> vector_cast(const vector<TI, N> &x) {
  vector<TO, N * sizeof(TI) / sizeof(TO)> r;
  std::memcpy(r.v.data(), x.v.data(), sizeof(TI) * N);
  return r;
}

// ---- arithmetic [API-arith] -----------------------------------------------------------------
namespace detail {
template <typename T> using arith_t = std::conditional_t<std::is_same_v<T, bfloat16>, float, T>;
template <typename T, unsigned N, typename F>
vector<T, N> lanewise(const vector<T, N> &a, const vector<T, N> &b, F f) {
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = T(f(arith_t<T>(a.v[i]), arith_t<T>(b.v[i])));
  return r;
}
template <typename T> struct mul_acc { using type = accfloat; };
template <> struct mul_acc<int8> { using type = acc32; };
template <> struct mul_acc<int16> { using type = acc32; };
}  // namespace detail

// add/sub/min/max of two vectors (or vector and scalar): lanewise, one IEEE rounding for floats;
// bf16 results round by the current mode (the core computes on fp32 and converts).
template <typename T, unsigned N>
vector<T, N> add(const vector<T, N> &a, const vector<T, N> &b) {
  return detail::lanewise(a, b, [](auto x, auto y) { return x + y; });
}
template <typename T, unsigned N>
vector<T, N> add(const vector<T, N> &a, T s) { return add(a, broadcast<T, N>(s)); }
template <typename T, unsigned N>
vector<T, N> sub(const vector<T, N> &a, const vector<T, N> &b) {
  return detail::lanewise(a, b, [](auto x, auto y) { return x - y; });
}
template <typename T, unsigned N>
vector<T, N> sub(const vector<T, N> &a, T s) { return sub(a, broadcast<T, N>(s)); }
// max/min: IEEE maxNum-like for ordered values; NaN lanes propagate the other operand unless
// both are NaN (not exercised: the project's inputs are finite or +-inf).
template <typename T, unsigned N>
vector<T, N> max(const vector<T, N> &a, const vector<T, N> &b) {
  return detail::lanewise(a, b, [](auto x, auto y) { return x < y ? y : x; });
}
template <typename T, unsigned N>
vector<T, N> max(const vector<T, N> &a, T s) { return max(a, broadcast<T, N>(s)); }
template <typename T, unsigned N>
vector<T, N> min(const vector<T, N> &a, const vector<T, N> &b) {
  return detail::lanewise(a, b, [](auto x, auto y) { return y < x ? y : x; });
}
template <typename T, unsigned N>
vector<T, N> min(const vector<T, N> &a, T s) { return min(a, broadcast<T, N>(s)); }
template <typename T, unsigned N>
vector<T, N> neg(const vector<T, N> &a) {           // exact sign flip
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = T(-detail::arith_t<T>(a.v[i]));
  return r;
}
// Integer lanes: bit ops used by the exp kernel's exponent construction.
template <typename T, unsigned N>
vector<T, N> upshift(const vector<T, N> &a, unsigned s) {
  static_assert(std::is_integral_v<T>, "upshift: integer lanes");
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = T(uint32_t(a.v[i]) << s);
  return r;
}

template <typename T, unsigned N>
vector<T, N> downshift(const vector<T, N> &a, unsigned s) {   // arithmetic shift right
  static_assert(std::is_integral_v<T>, "downshift: integer lanes");
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = T(a.v[i] >> s);
  return r;
}
template <typename T, unsigned N>
vector<T, N> abs(const vector<T, N> &a) {                       // exact (clears the sign)
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = T(std::fabs(detail::arith_t<T>(a.v[i])));
  return r;
}

namespace detail {
// AIE2P has no fp32 multiplier: aie_api's FP32 emulation (include/aie_api/detail/aie2p/
// config.hpp: __AIE_API_FP32_EMULATION__, __AIE_API_FP32_SUPPORT__ 0) forwards float x float to
// the compiler's mul_elem intrinsics, which split each operand into three bf16 parts by
// truncation (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)) and accumulate the
// 9 exact bf16 products in fp32, smallest first: lo*lo', lo*mid', mid*lo', hi*lo', mid*mid',
// lo*hi', mid*hi', hi*mid', hi*hi' ("accuracy safe"; Xilinx/llvm-aie clang/lib/Headers/
// aiev2_core.h, index version, the AIE2 bodies; the AIE2P bodies are assumed the same, see
// docs/kernels.md). Non-finite operands: the IEEE product (not modelled further).
inline float bf16_trunc(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xFFFF0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
inline float fp32_mul_emulated(float x, float y) {
  if (!std::isfinite(x) || !std::isfinite(y)) return x * y;
  const float a = bf16_trunc(x), b = bf16_trunc(x - a), c = bf16_trunc(x - a - b);
  const float d = bf16_trunc(y), e = bf16_trunc(y - d), f = bf16_trunc(y - d - e);
  float acc = c * f;
  acc += c * e;
  acc += b * f;
  acc += a * f;
  acc += b * e;
  acc += c * d;
  acc += b * d;
  acc += a * e;
  acc += a * d;
  return acc;
}
}  // namespace detail

// mul(a, b) -> accum: lanewise product into the default accumulator for the input type
// (accfloat for bfloat16/float, acc32 for int8/int16) [API-arith]. bf16 x bf16 is exact in
// fp32; float x float is aie_api's FP32 emulation (detail::fp32_mul_emulated, the model every
// KernelSpec.fp32_mul names). mac(acc, a, b) = acc + a*b, the add rounded once.
template <typename T, unsigned N>
accum<typename detail::mul_acc<T>::type, N> mul(const vector<T, N> &a, const vector<T, N> &b) {
  accum<typename detail::mul_acc<T>::type, N> r;
  for (unsigned i = 0; i < N; ++i) {
    if constexpr (std::is_same_v<T, float>)
      r.v[i] = detail::fp32_mul_emulated(a.v[i], b.v[i]);
    else
      r.v[i] = detail::to_acc<typename detail::mul_acc<T>::type>(detail::arith_t<T>(a.v[i])) *
               detail::to_acc<typename detail::mul_acc<T>::type>(detail::arith_t<T>(b.v[i]));
  }
  return r;
}
template <typename T, unsigned N>
accum<typename detail::mul_acc<T>::type, N> mul(const vector<T, N> &a, T s) {
  return mul(a, broadcast<T, N>(s));
}
template <typename Tag, typename T, unsigned N>
accum<Tag, N> mac(const accum<Tag, N> &acc, const vector<T, N> &a, const vector<T, N> &b) {
  accum<typename detail::mul_acc<T>::type, N> p = mul(a, b);
  accum<Tag, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = acc.v[i] + p.v[i];
  return r;
}
// ---- elementary functions [API-arith] --------------------------------------------------------
// inv(x) = 1/x correctly rounded; invsqrt(x) = 1/sqrt(x) (sqrt rounded, then the division);
// sqrt(x) correctly rounded. (Accuracy of the hardware's versions: not verified here.)
template <unsigned N>
vector<float, N> inv(const vector<float, N> &a) {
  vector<float, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = 1.0f / a.v[i];
  return r;
}
inline float inv(float a) { return 1.0f / a; }
inline float invsqrt(float a) { return 1.0f / std::sqrt(a); }
template <unsigned N>
vector<float, N> invsqrt(const vector<float, N> &a) {
  vector<float, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = 1.0f / std::sqrt(a.v[i]);
  return r;
}
// sqrt(x) correctly rounded.
template <unsigned N>
vector<float, N> sqrt(const vector<float, N> &a) {
  vector<float, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = std::sqrt(a.v[i]);
  return r;
}

// ---- reductions [API-arith] ------------------------------------------------------------------
// Pairwise halving: lanes i and i + N/2 combine, until one lane is left.
template <typename T, unsigned N>
T reduce_add(const vector<T, N> &a) {
  std::array<detail::arith_t<T>, N> t;
  for (unsigned i = 0; i < N; ++i) t[i] = detail::arith_t<T>(a.v[i]);
  for (unsigned h = N / 2; h >= 1; h /= 2)
    for (unsigned i = 0; i < h; ++i) t[i] = t[i] + t[i + h];
  return T(t[0]);
}
template <typename T, unsigned N>
T reduce_max(const vector<T, N> &a) {
  std::array<detail::arith_t<T>, N> t;
  for (unsigned i = 0; i < N; ++i) t[i] = detail::arith_t<T>(a.v[i]);
  for (unsigned h = N / 2; h >= 1; h /= 2)
    for (unsigned i = 0; i < h; ++i) t[i] = t[i] < t[i + h] ? t[i + h] : t[i];
  return T(t[0]);
}

// ---- comparison, selection [API-arith] -------------------------------------------------------
template <unsigned N>
struct mask {
  std::array<bool, N> m{};
};
template <typename T, unsigned N>
mask<N> lt(const vector<T, N> &a, T s) {
  mask<N> r;
  for (unsigned i = 0; i < N; ++i) r.m[i] = detail::arith_t<T>(a.v[i]) < detail::arith_t<T>(s);
  return r;
}
template <typename T, unsigned N>
mask<N> gt(const vector<T, N> &a, T s) {
  mask<N> r;
  for (unsigned i = 0; i < N; ++i) r.m[i] = detail::arith_t<T>(s) < detail::arith_t<T>(a.v[i]);
  return r;
}
// select(a, b, m): lane i is b[i] where m[i] is set, else a[i].
template <typename T, unsigned N>
vector<T, N> select(const vector<T, N> &a, const vector<T, N> &b, const mask<N> &m) {
  vector<T, N> r;
  for (unsigned i = 0; i < N; ++i) r.v[i] = m.m[i] ? b.v[i] : a.v[i];
  return r;
}
template <typename T, unsigned N>
vector<T, N> select(const vector<T, N> &a, T b, const mask<N> &m) {
  return select(a, broadcast<T, N>(b), m);
}

// ---- reshaping [API-arith] -------------------------------------------------------------------
template <typename T, unsigned N, typename... Rest>
auto concat(const vector<T, N> &a, const Rest &...rest) {
  constexpr unsigned total = N * (1 + sizeof...(Rest));
  vector<T, total> r;
  unsigned off = 0;
  auto put = [&](const vector<T, N> &x) { for (unsigned i = 0; i < N; ++i) r.v[off++] = x.v[i]; };
  put(a);
  (put(rest), ...);
  return r;
}
// transpose(v, rows, cols): v holds a rows x cols row-major matrix; returns cols x rows.
template <typename T, unsigned N>
vector<T, N> transpose(const vector<T, N> &a, unsigned rows, unsigned cols) {
  vector<T, N> r;
  for (unsigned i = 0; i < rows; ++i)
    for (unsigned j = 0; j < cols; ++j) r.v[j * rows + i] = a.v[i * cols + j];
  return r;
}

// ---- matrix multiplication [API-mmul] --------------------------------------------------------
// mmul<M, K, N, TA, TB, Acc>: C (M x N, row-major lanes) op= A (M x K) * B (K x N). Each C lane
// accumulates its K products in ascending k, one rounded add per product for accfloat (the
// bf16 products are exact); integer lanes are exact (acc32 wraps).
template <typename TA, typename TB> struct mmul_default_acc { using type = accfloat; };
template <> struct mmul_default_acc<int8, int8> { using type = acc32; };

template <unsigned M, unsigned K, unsigned N, typename TA, typename TB = TA, typename AccTag = accauto>
struct mmul {
  using acc_tag = std::conditional_t<std::is_same_v<AccTag, accauto>,
                                     typename mmul_default_acc<TA, TB>::type, AccTag>;
  static constexpr unsigned size_A = M * K, size_B = K * N, size_C = M * N;
  accum<acc_tag, size_C> c;
  mmul() = default;
  template <typename E>
  mmul(const vector<E, size_C> &x) : c(x) {}
  mmul(const accum<acc_tag, size_C> &a) : c(a) {}
  void mac(const vector<TA, size_A> &a, const vector<TB, size_B> &b) {
    using S = typename acc_storage<acc_tag>::type;
    for (unsigned i = 0; i < M; ++i)
      for (unsigned j = 0; j < N; ++j) {
        S acc = c.v[i * N + j];
        for (unsigned k = 0; k < K; ++k)
          acc = acc + detail::to_acc<acc_tag>(detail::arith_t<TA>(a.v[i * K + k])) *
                          detail::to_acc<acc_tag>(detail::arith_t<TB>(b.v[k * N + j]));
        c.v[i * N + j] = acc;
      }
  }
  template <typename T>
  auto to_vector(int shift = 0) const { return c.template to_vector<T>(shift); }
};
}  // namespace aie

// mac_8x8_8x8T(A, B, acc): AIE2P bfp16 intrinsic used by mlir-aie mm_bfp.cc: acc (8x8 fp32) +=
// A (8x8 blocks, one block per row of 8 k) x B^T, B given as 8 rows of 8 k (one block per row).
// Products m_a * m_b * 2^(e_a + e_b - 266) are exact in fp32; each lane adds them in ascending k.
inline aie::accum<accfloat, 64> mac_8x8_8x8T(const aie::block_vector<bfp16ebs8, 64> &a,
                                             const aie::block_vector<bfp16ebs8, 64> &b,
                                             const aie::accum<accfloat, 64> &acc) {
  aie::accum<accfloat, 64> r = acc;
  for (unsigned i = 0; i < 8; ++i)
    for (unsigned j = 0; j < 8; ++j) {
      float s = r.v[i * 8 + j];
      for (unsigned k = 0; k < 8; ++k) s = s + a.get(i * 8 + k) * b.get(j * 8 + k);
      r.v[i * 8 + j] = s;
    }
  return r;
}
