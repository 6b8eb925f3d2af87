"""Vector-unit cost of each elementwise / row op, derived from the upstream AIE2P kernels.

Unit: VLIW cycles per 32-lane bf16 vector (512 bits, one AIE2P vector register: mlir-aie
aie_kernels/aie2p/add.cc "32 bf16 = 512 bits = one AIE2P vector register"), over all of the
op's loops. Derivation rule (docs/simulator.md section 2 "vector unit"), per loop body:
  cycles = max(vector-slot instructions, load cycles, store cycles)
- one vector instruction issues per cycle (AMD UG1079 "only one fixed-point or floating-point
  vector instruction per cycle"; AM020: one vector unit per VLIW bundle); every aie_api call
  that maps to the vector unit counts one: add/sub/mul/mac/max/min/select/compare, an
  accumulator<->vector conversion (to_vector, srs), an elementary function (exp2, tanh, inv,
  invsqrt: native vector functions on XDNA2, aie_api UG1529 'Elementary Functions'); a lane
  reduction (reduce_max/reduce_add over 32 lanes) counts log2(32) = 5 shuffle+op pairs = 10;
- loads: two 256-bit load units (one 512-bit vector per cycle), stores: one 256-bit store unit
  (a 512-bit vector takes 2 cycles) (AMD AM020 'Functional Overview'; hw Generation
  vector_load_bits / vector_store_bits);
- an elementary function in the loop's dependency chain leaves the pipelined loop latency-bound:
  mlir-aie gelu.cc (commit 07c26dac) reports II=18 for a body of 12 vector instructions with one
  vtanh; the 6 extra bundles (ELEMENTARY_STALL) are charged once per elementary function.
Ops with an upstream AIE2P kernel are counted from it (path and commit given); the rest name
the kernel they are derived by analogy from. Kernels on 16-lane vectors (rms_norm.cc,
silu.cc) are counted per 16 lanes and doubled.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch_xdna.hw.sources import Sourced

BF16_LANES = 32                 # lanes of one 512-bit bf16 vector (add.cc)
REDUCE_32 = 10                  # log2(32) shuffle + op pairs of a 32-lane reduction
ELEMENTARY_STALL = 6            # gelu.cc II=18 minus its 12 vector instructions

MLIR_AIE = "Xilinx/mlir-aie aie_kernels/aie2p/"


@dataclass(frozen=True)
class VectorOpCost:
    """Per 32-lane bf16 vector: vector-slot instructions (incl. stalls), vectors loaded and
    vectors stored, summed over the op's loops."""

    instr: float
    loads: float
    stores: float


def _c(instr: float, loads: float, stores: float, source: str) -> Sourced[VectorOpCost]:
    return Sourced(VectorOpCost(float(instr), float(loads), float(stores)), source)


_ELTWISE2 = _c(1, 2, 1, MLIR_AIE + "add.cc / mul.cc (commit 08c79115): load A, load B, one "
               "aie::add/aie::mul, store: 1 instruction, 2 loads, 1 store")
_UNARY1 = _c(1, 1, 1, MLIR_AIE + "relu.cc (commit 63c63bba): one aie::max against zero per "
             "vector; by analogy every one-instruction unary op (neg, abs, compare-to-const)")
_COMPARE2 = _c(1, 2, 1, "by analogy to " + MLIR_AIE + "add.cc: two loads, one aie::lt/eq/band "
               "compare or bit operation, one (mask) store")
_EXP = 3 + ELEMENTARY_STALL     # mul by log2e, to_vector<float>, aie::exp2 (+ stall)
_INV = 2 + ELEMENTARY_STALL     # to_vector<float>, aie::inv / aie::invsqrt (+ stall)
_TANH = 2 + ELEMENTARY_STALL    # to_vector<float>, aie::tanh (+ stall)

VECTOR_OP_CYCLES: dict[str, Sourced[VectorOpCost]] = {
    **{op: _ELTWISE2 for op in ("add", "sub", "mul", "maximum", "minimum")},
    **{op: _UNARY1 for op in ("neg", "relu", "abs", "isnan", "isinf", "isneginf", "isposinf",
                              "isfinite", "logical_not", "bitwise_not")},
    **{op: _COMPARE2 for op in ("eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
                                "bitwise_or", "bitwise_xor", "logical_and", "logical_or",
                                "logical_xor")},
    "square": _c(1, 1, 1, MLIR_AIE + "rms_norm.cc (commit 08c556e3): one aie::mul_square"),
    "clamp": _c(2, 1, 1, "by analogy to " + MLIR_AIE + "bf16_exp.cc clamp: aie::max + aie::min"),
    "where": _c(1, 3, 1, MLIR_AIE + "bf16_exp.cc (commit 15d6c8ed): one aie::select; three "
                "operand loads (mask, a, b)"),
    "copy": _c(0, 1, 1, "no arithmetic: one load and one store per vector (AM020 load/store "
               "units)"),
    "exp": _c(_EXP, 1, 1, MLIR_AIE + "softmax.cc (commit 0429335f) loop 2 form: aie::mul by "
              "log2e, to_vector<float>, XDNA2-native aie::exp2 (+ elementary stall)"),
    "reciprocal": _c(_INV, 1, 1, "aie::inv on a float vector (aie_api UG1529 Elementary "
                     "Functions; XDNA2 vector) + to_vector<float> (+ elementary stall)"),
    "rsqrt": _c(_INV, 1, 1, "aie::invsqrt on a float vector (aie_api UG1529) + "
                "to_vector<float> (+ elementary stall)"),
    "sqrt": _c(_INV + 1, 1, 1, "x * invsqrt(x): aie::invsqrt + aie::mul (aie_api UG1529)"),
    "div": _c(_INV + 1, 2, 1, "a * inv(b): aie::inv + aie::mul (aie_api UG1529), two loads"),
    "tanh": _c(_TANH, 1, 1, "aie::tanh<bfloat16>(v.to_vector<float>()) as used in "
               + MLIR_AIE + "gelu.cc / silu.cc (+ elementary stall)"),
    "sigmoid": _c(2 * (5 + ELEMENTARY_STALL), 1, 1, MLIR_AIE + "silu.cc (commit 1351c7a5) "
                  "sigmoid part on 16-lane vectors: mul 0.5, to_vector<float>, aie::tanh, add 1, "
                  "mul 0.5 = 5 (+ stall) per 16 lanes, x2 per 32"),
    "silu": _c(2 * (7 + ELEMENTARY_STALL), 1, 1, MLIR_AIE + "silu.cc (commit 1351c7a5) on "
               "16-lane vectors: mul, to_vector<float>, aie::tanh, add, mul, mul, srs = 7 "
               "(+ stall) per 16 lanes, x2 per 32"),
    "gelu": _c(18, 1, 1, MLIR_AIE + "gelu.cc (commit 07c26dac): 'the post-RA pipeliner achieves "
               "II=18' per 32-lane vector (tanh form; erf GELU charged the same)"),
    "gelu_tanh": _c(18, 1, 1, MLIR_AIE + "gelu.cc (commit 07c26dac): II=18 per 32-lane vector"),
    "erf": _c(18, 1, 1, "by analogy to " + MLIR_AIE + "gelu.cc (II=18): one elementary "
              "function and a short polynomial around it"),
    "log": _c(_EXP, 1, 1, "by analogy to exp (no AIE2P log kernel upstream): one elementary "
              "evaluation with a multiply and a conversion (+ stall)"),
    "pow": _c(2 * _EXP + 1, 1, 1, "exp2(p * log2 x): the log (by analogy to exp) and exp costs "
              "above + one mul"),
    "sin": _c(2 * _EXP, 1, 1, "ASSUMPTION (no AIE2P vector sin/cos: aie_api sin/cos are AIE1 "
              "only; mlir-aie rope.cc reads cos/sin from a host table): fp32 range reduction and a "
              "polynomial, charged as two elementary evaluations"),
    "cos": _c(2 * _EXP, 1, 1, "ASSUMPTION, the same as sin"),
    "softmax": _c((2 + REDUCE_32) + (5 + ELEMENTARY_STALL) + 2, 3, 2,
                  MLIR_AIE + "softmax.cc (commit 0429335f), three loops: (1) mul by log2e, "
                  "to_vector, reduce_max = 12; (2) mul, sub, to_vector<float>, aie::exp2, add "
                  "(+ stall) = 11, store; (3) mul by 1/sum, srs = 2, store"),
    "log_softmax": _c((2 + REDUCE_32) + (5 + ELEMENTARY_STALL) + 2, 3, 2,
                      MLIR_AIE + "softmax.cc loops (1) and (2) as softmax; (3) one sub of log(sum) "
                      "instead of the scale"),
    "rms_norm": _c(2 * 3 + 2 * 2, 2, 1, MLIR_AIE + "rms_norm.cc (commit 08c556e3) on 16-lane "
                   "vectors: (1) mul_square, add, to_vector = 3; (2) mul, mul = 2 per 16 lanes, "
                   "x2 per 32"),
    "layer_norm": _c(3 + 4, 2, 1, MLIR_AIE + "layer_norm.cc (commit 08c79115) bf16 N=32: (1) "
                     "add (acc), mul, add = 3; (2) sub, mul, mul, add = 4, store"),
    "sum": _c(1, 1, 0, "one accumulator add per vector, as " + MLIR_AIE + "layer_norm.cc loop 1 "
              "(commit 08c79115)"),
    "mean": _c(1, 1, 0, "by analogy to sum (the final scale is per row, scalar)"),
    "amax": _c(1, 1, 0, "by analogy to layer_norm.cc loop 1: one aie::max into a running "
               "vector per vector (softmax.cc reduces in the loop; a running max needs one)"),
    "all": _c(1, 1, 0, "by analogy to amax (aie::band into a running mask)"),
    "any": _c(1, 1, 0, "by analogy to amax (aie::bor into a running mask)"),
    "cumsum": _c(REDUCE_32 + 1, 1, 1, "in-vector Hillis-Steele scan: log2(32) shift+add pairs "
                 "and one carry add (by analogy to the lane reduction)"),
}

# flash attention's online softmax per score (kernels/ops/attention.py): softmax.cc loop 2 with the
# row max kept running (one aie::max per vector, no in-loop lane reduction) and P converted to
# bf16 for the P @ V mmul: mul by scale*log2e, max, sub, to_vector<float>, exp2, add, srs
ATTENTION_SOFTMAX = _c(7 + ELEMENTARY_STALL, 0, 0, MLIR_AIE + "softmax.cc (commit 0429335f) "
                       "loop 2 + a running aie::max + the bf16 P conversion, scores in L1 "
                       "(no loads/stores beyond the mmul operands)")

# dequantization of one 32-lane vector of weights on the core (kernels/ops/gemm.py weight-only
# GEMM; int8 KV cache in attention): unpack/convert to bf16 (int4: two nibble unpacks), one
# scale mul, one srs to bf16
DEQUANT_INT8 = _c(3, 0.5, 1, "int8 -> bf16: aie::to_float conversion (UG1529 'Floating-point "
                  "Conversion': XDNA2 runs on the vector unit), one aie::mul by the group "
                  "scale, one srs; 32 int8 = 256 bits = half a vector load; written back to L1 as "
                  "the bf16 mmul operand")
DEQUANT_INT4 = _c(4, 0.25, 1, "int4 -> bf16: an unpack (int4 -> int8, UG1583 Pack/Unpack), "
                  "then as int8; 32 int4 = 128 bits")


def cycles_per_elem(cost: VectorOpCost, in_bits: int, out_bits: int, load_bits: int,
                    store_bits: int) -> float:
    """Core cycles per element of an op whose operands are `in_bits` and result `out_bits`
    wide in L1: the busiest VLIW slot over the op's loops (instruction count, or loads at
    `load_bits` per cycle, or stores at `store_bits` per cycle)."""
    load = cost.loads * BF16_LANES * in_bits / load_bits
    store = cost.stores * BF16_LANES * out_bits / store_bits
    return max(cost.instr, load, store) / BF16_LANES


def op_cost(op: str) -> Sourced[VectorOpCost] | None:
    """The sourced cost of a vector op, or None when the op has no entry (callers fall back)."""
    return VECTOR_OP_CYCLES.get(op)


def dequant_cycles(weight_bits: int, load_bits: int, store_bits: int) -> float:
    """Core cycles per int4/int8 weight dequantized to the bf16 mmul operand (the vector unit
    also runs the mmul, so these add to the MAC cycles: AM020/UG1079 one vector instruction per
    cycle). Also the per-element cost of an int8 KV cache's dequant in attention."""
    cost = (DEQUANT_INT4 if weight_bits == 4 else DEQUANT_INT8).value
    return cycles_per_elem(cost, weight_bits, 16, load_bits, store_bits)
