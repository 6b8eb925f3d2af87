// Row access for the row kernels (softmax, layer_norm, rms_norm) in the array IR's form.
//
// A row of n input values is read as fp32 operands: a bf16 input is first widened once into the
// kernel's fp32 working row `work` (the L1 row VectorDesign's plan reserves for non-fp32 inputs);
// an fp32 input is rounded to its bf16 operand on each load (numerics.operand: the row ops are off
// the exact fp32 path). Padded lanes of a partial chunk take `pad`.
#pragma once

#include "xdna_vec.h"

namespace xdna {

template <typename TI>
struct Row {
  const TI *x;          // this row of the input
  float *work;          // fp32 working row (bf16 inputs), else nullptr
  int n;
  Row(const TI *x_, float *work_, int n_) : x(x_), work(work_), n(n_) {
    if constexpr (!std::is_same_v<TI, float>)
      for (int i = 0; i < n; i += L) store_part(work, i, n, load_f32(x, i, n));
  }
  vf operator()(int i, float pad = 0.0f) const {
    if constexpr (std::is_same_v<TI, float>) {
      vf v = to_f32(to_bf16(load_f32(x, i, n)));
      if (i + int(L) > n)
        for (unsigned j = n - i; j < L; ++j) v.set(pad, j);
      return v;
    } else {
      return load_f32(work, i, n, pad);
    }
  }
};

// Elements [i, i + 16) of a row parameter (norm weight / bias) as fp32 operands: fp32 values
// rounded to bf16 (numerics.operand), bf16 as they are.
template <typename T>
inline vf load_operand(const T *p, int i, int n) {
  vf v = load_f32(p, i, n);
  if constexpr (std::is_same_v<T, float>) v = to_f32(to_bf16(v));
  return v;
}

}  // namespace xdna
