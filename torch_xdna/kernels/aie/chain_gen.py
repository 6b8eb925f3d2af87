"""C++ for fused elementwise chains (the array IR's `chain_<hash>` unit kernels), generated from
the chain's steps at build time.

kernels/lower/vector.chain_program lowers a ChainDesign to one unit kernel per chain whose
arguments follow the IR's channel decision: the streamed inputs (first alone and the rest packed,
or all packed in one buffer, parts of n elements in input order), the resident (broadcast)
inputs packed in one buffer, each repeated to the unit (so every input is read at the same
index), the outputs, n. `chain_source` writes a kernel with exactly that signature whose body
evaluates the steps on 16-lane fp32 vectors with the chain's numerics (fused.ChainDesign: exact
ops on the fp32 values, the others on bf16 operands; xdna_vec.h's transcendentals), and
`golden.chain` evaluates the same steps in the same order. Chains with other steps (row ops,
layout steps, compares, step parameters) have no C++ form: KernelContractError names the step.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.aie.spec import KernelContractError, KernelSpec, ir_signature

# op -> (arity, exact fp32 path, C++ expression over {0}, {1}); golden.ELTWISE has the same ops
CHAIN_CXX = {
    "add": (2, True, "aie::add({0}, {1})"), "sub": (2, True, "aie::sub({0}, {1})"),
    "maximum": (2, True, "aie::max({0}, {1})"), "minimum": (2, True, "aie::min({0}, {1})"),
    "neg": (1, True, "aie::neg({0})"), "abs": (1, True, "aie::abs({0})"),
    "relu": (1, True, "aie::max({0}, 0.0f)"),
    "mul": (2, False, "xdna::fmul({0}, {1})"), "div": (2, False, "xdna::fmul({0}, aie::inv({1}))"),
    "exp": (1, False, "xdna::exp_f32({0})"), "sigmoid": (1, False, "xdna::sigmoid_f32({0})"),
    "silu": (1, False, "xdna::silu_f32({0})"), "tanh": (1, False, "xdna::tanh_f32({0})"),
    "gelu": (1, False, "xdna::gelu_f32({0})"), "reciprocal": (1, False, "aie::inv({0})"),
    "sqrt": (1, False, "aie::sqrt({0})"), "rsqrt": (1, False, "aie::invsqrt({0})"),
}
_CT = {"f32": "float", "bf16": "bfloat16"}


def _layout(decl, chain) -> tuple[list[list[int]], list[int], list[str]]:
    """(input indices per streamed buffer, resident input indices, C types of the pointers)."""
    in_shapes, in_dtypes, steps, outputs, out_dtypes = chain
    sizes = [int(torch.Size(s).numel()) for s in in_shapes]
    n = max(sizes + [1])
    streamed = [i for i, m in enumerate(sizes) if m == n]
    resident = [i for i, m in enumerate(sizes) if m != n]
    ptrs = [t for t in ir_signature(decl.arg_types) if t.endswith("*")]
    n_groups = len(ptrs) - len(outputs) - (1 if resident else 0)
    groups = [streamed] if n_groups == 1 else [streamed[:1], streamed[1:]]
    if n_groups not in (1, 2) or (n_groups == 2 and len(streamed) < 2):
        raise KernelContractError(f"{decl.symbol}: {len(ptrs)} buffers do not fit the chain's "
                                  f"{len(streamed)} streamed, {len(resident)} resident inputs")
    for t in ptrs:
        if t[:-1] not in _CT:
            raise KernelContractError(f"{decl.symbol}: a {t} buffer (inputs of mixed dtypes packed "
                                      "as bytes) has no generated C++ form")
    return groups, resident, [_CT[t[:-1]] for t in ptrs]


def chain_source(decl, chain) -> tuple[str, KernelSpec]:
    """(C++ source, its KernelSpec) of the chain unit kernel `decl` (an ir.KernelDecl) for the
    program note `chain` = (in_shapes, in_dtypes, steps, outputs, out_dtypes)."""
    in_shapes, in_dtypes, steps, outputs, out_dtypes = chain
    groups, resident, ctypes = _layout(decl, chain)
    body, loads = [], {}
    names = [f"g{k}" for k in range(len(groups))] + (["par"] if resident else []) + \
        [f"o{k}" for k in range(len(outputs))]
    for g, idx in enumerate(groups):
        for part, i in enumerate(idx):
            loads[i] = f"xdna::load_f32(g{g} + {part} * n, i, n)"
    for part, i in enumerate(resident):
        loads[i] = f"xdna::load_f32(par + {part} * n, i, n)"
    for i, src in sorted(loads.items()):
        body.append(f"    const vf x{i} = {src};")
    for j, (op, args, params) in enumerate(steps):
        if op not in CHAIN_CXX or params:
            raise KernelContractError(f"{decl.symbol}: chain step {j} ({op}{' ' + str(params) if params else ''}) "
                                      "has no generated C++ form")
        arity, exact, expr = CHAIN_CXX[op]
        vals = []
        for a in args:
            if isinstance(a, tuple) and len(a) == 2 and a[0] in ("in", "s"):
                v = f"x{a[1]}" if a[0] == "in" else f"s{a[1]}"
                vals.append(v if exact else f"bf({v})")
            elif isinstance(a, (int, float)) and not isinstance(a, bool):
                vals.append(f"aie::broadcast<float, L>({float(a)!r}f)")
            else:
                raise KernelContractError(f"{decl.symbol}: chain step {j} argument {a!r} has no "
                                          "generated C++ form")
        if len(vals) != arity:
            raise KernelContractError(f"{decl.symbol}: chain step {j} ({op}) takes {arity} values")
        body.append(f"    const vf s{j} = {expr.format(*vals)};")
    for k, i in enumerate(outputs):
        body.append(f"    xdna::store_part(o{k}, i, n, s{i});")
    params = [f"{'const ' if not nm.startswith('o') else ''}{ct} *{nm}" for ct, nm in zip(ctypes, names)]
    src = "\n".join([
        f"// {decl.symbol}: a fused elementwise chain, generated by torch_xdna/kernels/aie/chain_gen.py",
        f"// steps: {steps!r}",
        f"// outputs: {outputs!r}; inputs {in_shapes!r} {in_dtypes!r}",
        '#include "xdna_vec.h"', "",
        "using xdna::L;", "using xdna::vf;", "",
        "// an operand off the exact fp32 path: its bf16 value (numerics.operand)",
        "static inline vf bf(const vf &v) { return xdna::to_f32(xdna::to_bf16(v)); }", "",
        f'extern "C" void {decl.symbol}({", ".join(params)}, int32 n) {{',
        "  xdna::set_numerics();",
        "  for (int i = 0; i < n; i += L) {", *body, "  }", "}", ""])
    sig = ir_signature(decl.arg_types)
    args = tuple((nm, t) for nm, t in zip(names + ["n"], sig))
    spec = KernelSpec(decl.symbol, f"{decl.symbol}.cc", args, (), "chain", "fused.ChainDesign")
    if len(args) != len(sig) or sig[-1] != "i32":
        raise KernelContractError(f"{decl.symbol}: the IR passes ({', '.join(sig)}), a chain unit "
                                  "takes its buffers and n:i32")
    return src, spec
