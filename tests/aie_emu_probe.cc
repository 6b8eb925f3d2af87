// Probes of the aie_api host emulation itself (tests/test_aie_kernels.py): the rounding register
// and the accfloat -> bfp16ebs8 conversion, checked against kernels/numerics.py and quant.py.
#include <aie_api/aie.hpp>

#include <thread>

extern "C" {

// The mode a fresh core (thread) starts with: 0 = floor (numerics.py's hardware default).
int probe_reset_mode() {
  int mode = -1;
  std::thread t([&] { mode = int(aie::get_rounding()); });
  t.join();
  return mode;
}

// fp32 -> bf16 bits under `mode` (0 floor, 6 conv_even) through accum::to_vector<bfloat16>.
void probe_bf16(const float *in, uint16_t *out, int n, int mode) {
  aie::set_rounding(aie::rounding_mode(mode));
  for (int i = 0; i < n; i += 16) {
    aie::vector<float, 16> v = aie::load_v<16>(in + i);
    aie::vector<bfloat16, 16> b = aie::accum<accfloat, 16>(v).to_vector<bfloat16>();
    for (int j = 0; j < 16; ++j) out[i + j] = b[j].bits;
  }
}

// fp32 [nvec * 64] -> bfp16ebs8 bytes [nvec * 72] ([exponent, m0..m7] per block).
void probe_bfp16(const float *in, uint8_t *out, int nvec) {
  for (int v = 0; v < nvec; ++v) {
    aie::accum<accfloat, 64> a(aie::load_v<64>(in + v * 64));
    auto blk = a.to_vector<bfp16ebs8>();
    for (int b = 0; b < 8; ++b) {
      out[v * 72 + b * 9] = blk.exp[b];
      for (int j = 0; j < 8; ++j) out[v * 72 + b * 9 + 1 + j] = uint8_t(blk.mant[b * 8 + j]);
    }
  }
}
}
