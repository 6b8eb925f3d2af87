// Matrix-multiply micro-kernels for AIE2P: C (DIM_M x DIM_N) += A (DIM_M x DIM_K) * B (DIM_K x DIM_N),
// every tile row-major, as the array IR's core bodies pass them (kernels/lower/gemm.py).
//
// The native mmul shape r x s x t (hw/generations.py mmul_shape: bf16 4x8x8, int8 8x8x8) is
// assembled in registers from row segments of the row-major tiles (mlir-aie's aie2p mm.cc has
// the DMA pre-tile instead; the numerics are the same). A 2x2 expansion (two row blocks x two
// column blocks per step) keeps four accumulators live, as mm.cc does. C accumulates in place:
// zero it (zero.cc) before the first K block, one call per K block of the L1 tile.
//
// Numerics: bf16 operands, fp32 accumulation, each C lane adding its products in ascending k;
// Golden: golden.matmul_rowmajor. The int8 kernel is mm_i8.cc: one object per source holds
// every symbol of it, and the two need different tile multiples (static_asserts).
#include "xdna_mm.h"


extern "C" {

// bf16 x bf16 -> fp32 (mmul 4x8x8).
void matmul_bf16_f32(const bfloat16 *a, const bfloat16 *b, float *c) { matmul_bf16(a, b, c); }

}  // extern "C"
