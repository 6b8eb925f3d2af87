"""Lowering: each design family's plan -> ArrayPrograms (torch_xdna/array/ir.py).

`lower(design, gen)` returns the programs of one launch, run in order (most designs: one; a
GEMM with bias/residual adds an epilogue stage; fused LLM blocks run one program per stage with
a configure point between, intermediates in scratch host buffers named in each program's notes).

Core kernels the lowerings call (symbol: arguments, all tiles row-major; C++ in kernels/aie/):
  zero_f32 / zero_i32 (acc[tm,tn])                        acc = 0
  matmul_bf16_f32 (A[tm,tk] bf16, B[tk,tn] bf16, acc f32)   acc += A @ B
  matmul_i8_i32 (A i8, B i8, acc i32)                       acc += A @ B (int32)
  matmul_bf16_bfp16_f32 (A[tm,tk] bf16, Bt[tn, tk*9/8] u8, acc)  acc += bfp16(A) @ bfp16(B)
                                                            (Bt: encode_bfp16 rows of B^T)
  matmul_int8_bf16 / matmul_int4_bf16 / gemv_int8_bf16 / gemv_int4_bf16
      (A[tm,tk] bf16, P u8 [W tile (tn x tk int8, or tn x tk/2 packed int4) | scale tile
       (tn x sg bf16)], Wdq[tk,tn] bf16 scratch, acc f32, group i32, sg i32)
                                                            acc += A @ bf16(W * scale)^T
  store_<act>_<acc>_<out> (acc, C[tm,tn], alpha f32)        C = act(alpha * acc), rounded to C
  <op>_<in>_<out> (x, out, n i32)                        one-input unit of VectorDesign op <op>
  <op>_<in>_<out> (a, b, out, n) / <op>_pk_<in>_<out> (ab, out, n)
                                                            two-input unit: inputs on two
                                                            channels (or b resident), or packed
                                                            in one element (a then b)
  <row op>[_w|_nw]_<in>_<out> (x, [params], out, [work f32], rows i32, n i32, [eps, [offset]])
                                                            softmax / layer_norm / rms_norm rows
  chain_<hash> (streamed..., [resident], outs..., n)        one unit of a fused chain; C++
                                                            generated from notes["chain"]
  epilogue_<act>[_bias][_res[_pk]]_<acc>_<out> (T | TR, [R], [bias], C, n i32, cols i32, beta f32)
                                                            C = act(T + beta*bias) (+ R)
  gate_mul[_pk]_f32_<out> (T0, T1 | T0T1, out, n i32)       out = T0 * T1 (fp32, then stored)
  attn_init_f32 / attn_q[_masked]_bf16 / attn_tile[_masked]_bf16 / attn_finish_f32
                                                            see lower/attention.py
Each declaration matches kernels/aie KERNELS exactly (aie.check_decl; tests/test_kernel_contract.py);
object files are one per kernel source and tile defines (aie.object_files).
"""
from __future__ import annotations

from torch_xdna.kernels.lower import families  # noqa: F401  (fills the lowering table)
from torch_xdna.kernels.lower.builder import LoweringError
from torch_xdna.kernels.lower.dispatch import lower, lowerable

__all__ = ["LoweringError", "lower", "lowerable"]
