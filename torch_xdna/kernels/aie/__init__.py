"""AIE core kernels: C++ sources for the array's cores (aie2p/*.cc, written against AMD's AIE
API) and the table of their entry points.

The array IR's core bodies call these symbols by name; `xdna kernels build` compiles the sources
with the AIE toolchain (Peano / Chess) on a machine that has it. Here they are compiled for the
host against emu/aie_api (host_build.py) and checked against goldens (golden.py) in
tests/test_aie_kernels.py. See docs/kernels.md.

Argument types: "bf16*", "f32*", "i8*", "u8*", "i32*" are pointers to L1 buffers (bfp16ebs8
blocks and packed weights travel as "u8*"); "i32" and "f32" are scalars. `tile_defines` maps the
array IR's buffer shapes to a kernel's -D tile sizes.
"""
from __future__ import annotations

from torch_xdna.kernels.aie.spec import KernelContractError, KernelSpec, ir_signature

ARCH = "aie2p"


# AIE2P has no fp32 multiplier: aie_api emulates float x float with bf16 partial products
# (include/aie_api/detail/aie2p/config.hpp, __AIE_API_FP32_EMULATION__). A kernel either has no
# fp32 x fp32 multiply ("none": its products are bf16 x bf16 -> fp32, exact, or integer; the
# elementwise mul / square take bf16 operands and multiply them as bf16, xdna_vec.h bmul) or
# multiplies fp32 values and gets the emulation, which the host emulation (emu/aie_api mul)
# and the goldens (golden.fmul) compute: 3-way bf16 split, 9 products, smallest first.
FP32_MUL_MODELS = ("none", "bf16x3 emulation")
# the symbols that multiply fp32 values (xdna::fmul or aie::mul on float vectors)
_FP32_MUL_SOURCES = ("store.cc", "epilogue.cc", "softmax.cc", "layer_norm.cc", "rms_norm.cc",
                     "rope.cc", "qk_rope.cc", "attention.cc")
_FP32_MUL_OPS = ("div", "exp", "sigmoid", "silu", "tanh", "gelu", "gelu_tanh", "gate_mul",
                 "silu_mul")


def _fp32_mul(symbol: str, source: str) -> str:
    if source == "embed.cc":                   # only the fp32 row multiplies fp32 values
        return FP32_MUL_MODELS[1 if symbol == "embed_fp32_f32" else 0]
    if source in _FP32_MUL_SOURCES and not symbol.startswith("store_none_i32"):
        return FP32_MUL_MODELS[1]
    op = symbol.split("_pk_")[0] if "_pk_" in symbol else symbol.rsplit("_", 2)[0]
    if source in ("eltwise.cc", "binary.cc") and op in _FP32_MUL_OPS:
        return FP32_MUL_MODELS[1]
    return FP32_MUL_MODELS[0]


def _k(symbol, source, args, defines=(), golden="", reference="", mmul=()):
    return KernelSpec(symbol, source, tuple(tuple(a.split(":")) for a in args), tuple(defines),
                      golden, reference, mmul, _fp32_mul(symbol, source))


_MM = ("DIM_M", "DIM_K", "DIM_N")
_ELT_REF = "vector.OPS"
_SPECS = [
    _k("zero_f32", "zero.cc", ["c:f32*"], ("DIM_M", "DIM_N"), "zeros"),
    _k("zero_i32", "zero.cc", ["c:i32*"], ("DIM_M", "DIM_N"), "zeros"),
    _k("matmul_bf16_f32", "mm.cc", ["a:bf16*", "b:bf16*", "c:f32*"], _MM, "matmul_rowmajor",
       "gemm.GemmDesign (dtype bf16)", ("bf16", (4, 8, 8))),
    _k("matmul_i8_i32", "mm_i8.cc", ["a:i8*", "b:i8*", "c:i32*"], _MM, "matmul_rowmajor",
       "gemm.GemmDesign (dtype int8)", ("int8", (8, 8, 8))),
    _k("matmul_bf16_bfp16_f32", "mm_bfp16.cc", ["a:bf16*", "bt:u8*", "c:f32*"], _MM,
       "matmul_bfp16", "gemm.GemmDesign (dtype bfp16)", ("bfp16", (8, 8, 8))),
]
for _kind in ("matmul", "gemv"):
    for _bits in ("int8", "int4"):
        _SPECS.append(_k(f"{_kind}_{_bits}_bf16", "wq.cc",
                         ["a:bf16*", "p:u8*", "wdq:bf16*", "acc:f32*", "group:i32", "sg:i32"],
                         _MM, "dequant_rowmajor" if _kind == "matmul" else "gemv_q",
                         f"gemm.GemmDesign (dtype {_bits}, w_group)",
                         ("bf16", (4, 8, 8)) if _kind == "matmul" else ()))
STORE_ACTS = ("none", "relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid")
for _act in STORE_ACTS:
    for _out in ("f32", "bf16"):
        _SPECS.append(_k(f"store_{_act}_f32_{_out}", "store.cc",
                         ["acc:f32*", f"c:{_out}*", "alpha:f32"], ("DIM_M", "DIM_N", "DIM_MC"), "store",
                         "gemm.GemmDesign (alpha, epilogue; activations.apply_epilogue)"))
_SPECS.append(_k("store_none_i32_i32", "store.cc", ["acc:i32*", "c:i32*", "alpha:f32"],
                 ("DIM_M", "DIM_N", "DIM_MC"), "store", "gemm.GemmDesign (dtype int8, int32 out)"))
for _op in ("add", "sub", "max", "min"):
    _SPECS.append(_k(f"{_op}_f32", "eltwise.cc", ["a:f32*", "b:f32*", "out:f32*", "n:i32"],
                     golden=f"eltwise:{_op}", reference=_ELT_REF))
for _op in ("neg", "relu", "abs"):
    _SPECS.append(_k(f"{_op}_f32", "eltwise.cc", ["x:f32*", "out:f32*", "n:i32"],
                     golden=f"eltwise:{_op}", reference=_ELT_REF))
for _op in ("mul", "div"):
    _SPECS.append(_k(f"{_op}_bf16_f32", "eltwise.cc", ["a:bf16*", "b:bf16*", "out:f32*", "n:i32"],
                     golden=f"eltwise:{_op}", reference=_ELT_REF))
for _op in ("exp", "sigmoid", "silu", "tanh", "gelu", "gelu_tanh", "reciprocal", "sqrt", "rsqrt",
            "square"):
    _SPECS.append(_k(f"{_op}_bf16_f32", "eltwise.cc", ["x:bf16*", "out:f32*", "n:i32"],
                     golden=f"eltwise:{_op}", reference=_ELT_REF))
# the array IR's one-input unit kernels <op>_<in>_<out>(x, out, n) (kernels/lower/vector.py)
UNIT_OPS_EXACT = ("neg", "relu", "abs")
UNIT_OPS = UNIT_OPS_EXACT + ("exp", "sigmoid", "silu", "tanh", "gelu", "gelu_tanh", "reciprocal",
                             "sqrt", "rsqrt", "square")
_have = {s.symbol for s in _SPECS}
for _op in UNIT_OPS:
    for _in in ("f32", "bf16"):
        for _out in ("f32", "bf16"):
            _sym = f"{_op}_{_in}_{_out}"
            if _sym not in _have:
                _SPECS.append(_k(_sym, "eltwise.cc", [f"x:{_in}*", f"out:{_out}*", "n:i32"],
                                 golden=f"unit:{_op}", reference=f"vector.OPS['{_op}']"))
# the array IR's two-input unit kernels (binary.cc): separate buffers <op>_<in>_<out>(a, b, out,
# n) and packed <op>_pk_<in>_<out>(ab, out, n); int32 forms for the integer ops
BINARY_OPS_EXACT = ("add", "sub", "maximum", "minimum")
BINARY_OPS = BINARY_OPS_EXACT + ("mul", "div")
BINARY_OPS_I32 = ("add", "sub", "mul", "maximum", "minimum")
_have = {s.symbol for s in _SPECS}


def _binary_specs(op, dts, golden):
    for _in, _out in dts:
        ref = f"vector.OPS['{op}']" if not op.startswith("gate_mul") else "fused.GatedGemmDesign"
        sym = f"{op}_{_in}_{_out}"
        if sym not in _have:
            _SPECS.append(_k(sym, "binary.cc", [f"a:{_in}*", f"b:{_in}*", f"out:{_out}*", "n:i32"],
                             golden=golden, reference=ref))
        _SPECS.append(_k(f"{op}_pk_{_in}_{_out}", "binary.cc",
                         [f"ab:{_in}*", f"out:{_out}*", "n:i32"], golden=golden, reference=ref))


_FLOATS = [(i, o) for i in ("f32", "bf16") for o in ("f32", "bf16")]
for _op in BINARY_OPS:
    _binary_specs(_op, _FLOATS + ([("i32", "i32")] if _op in BINARY_OPS_I32 else []), f"binary:{_op}")
_binary_specs("gate_mul", [("f32", "f32"), ("f32", "bf16")], "binary:gate_mul")
_SPECS += [
    _k("silu_mul_bf16_f32", "eltwise.cc", ["gate:bf16*", "up:bf16*", "out:f32*", "n:i32"],
       golden="silu_mul", reference="llm_blocks (SwiGLU MLP: silu(gate) * up)"),
    _k("gelu_tanh_mul_bf16_f32", "eltwise.cc", ["gate:bf16*", "up:bf16*", "out:f32*", "n:i32"],
       golden="gelu_tanh_mul", reference="stages/llm_layer.gate_mul_rows (GeGLU MLP: Gemma)"),
    _k("cast_f32_bf16", "eltwise.cc", ["x:f32*", "out:bf16*", "n:i32"], golden="cast_bf16",
       reference="numerics.operand"),
    _k("rope_bf16_f32", "rope.cc",
       ["x:bf16*", "cos:bf16*", "signed_sin:bf16*", "out:f32*", "rows:i32", "d:i32"],
       golden="rope", reference="llm_blocks._rope"),
    _k("qk_norm_rope_bf16", "qk_rope.cc",
       ["xcs:bf16*", "w:bf16*", "out:bf16*", "work:f32*", "rows:i32", "d:i32", "eps:f32",
        "offset:f32"], golden="qk_norm_rope",
       reference="llm_layer_stages.qk_norm_rope_rows (llm_blocks._rms, _rope)"),
    _k("qk_rope_bf16", "qk_rope.cc", ["xcs:bf16*", "out:bf16*", "rows:i32", "d:i32"],
       golden="qk_rope", reference="llm_layer_stages.qk_rope_rows (llm_blocks._rope)"),
]
# the GEMM epilogue stage (epilogue.cc): epilogue_<act>[_bias][_res[_pk]]_f32_<out>
for _act in STORE_ACTS:
    for _out in ("f32", "bf16"):
        for _form, _bufs in (("", ["t:f32*"]), ("_bias", ["t:f32*", "bias:bf16*"]),
                             ("_res", ["t:f32*", "r:f32*"]), ("_res_pk", ["tr:f32*"]),
                             ("_bias_res_pk", ["tr:f32*", "bias:bf16*"])):
            _SPECS.append(_k(f"epilogue_{_act}{_form}_f32_{_out}", "epilogue.cc",
                             _bufs + [f"c:{_out}*", "n:i32", "cols:i32", "beta:f32"],
                             golden="epilogue", reference="gemm.GemmDesign (bias, residual, epilogue)"))
# the array IR's row units (softmax.cc, layer_norm.cc, rms_norm.cc): <op>[_w|_nw]_<in>_<out>
# (x, [params], out, [work f32* for bf16 inputs], rows, n, [eps, [offset]]); params are the IR's
# one resident element in the input's dtype ([w | b], [w], or none)
ROW_KERNELS = {                     # (op, variant) -> (source, parameter buffer, float scalars)
    ("softmax", ""): ("softmax.cc", "", ()),
    ("layer_norm", ""): ("layer_norm.cc", "wb", ("eps",)),
    ("layer_norm", "w"): ("layer_norm.cc", "w", ("eps",)),
    ("layer_norm", "nw"): ("layer_norm.cc", "", ("eps",)),
    ("rms_norm", ""): ("rms_norm.cc", "w", ("eps", "offset")),
    ("rms_norm", "nw"): ("rms_norm.cc", "", ("eps", "offset")),
}
_ROW_REF = {"softmax": "vector.OPS['softmax']", "layer_norm": "vector.OPS['layer_norm']",
            "rms_norm": "llm_blocks._rms, vector.OPS['rms_norm']"}
for (_op, _var), (_src, _par, _fl) in ROW_KERNELS.items():
    for _in, _out in _FLOATS:
        _args = [f"x:{_in}*"] + ([f"{_par}:{_in}*"] if _par else []) + [f"out:{_out}*"]
        _args += (["work:f32*"] if _in != "f32" else []) + ["rows:i32", "n:i32"]
        _args += [f"{f}:f32" for f in _fl]
        _SPECS.append(_k(f"{_op}{'_' + _var if _var else ''}_{_in}_{_out}", _src, _args,
                         golden=_op, reference=_ROW_REF[_op]))
_ATT = ("ATT_TQ", "ATT_TKV", "ATT_D")
_SPECS += [
    _k("attn_qk_bf16_f32", "attention.cc",
       ["q:bf16*", "k:bf16*", "s:f32*", "scale:f32", "q_pos0:i32", "k_pos0:i32", "kv_valid:i32",
        "causal:i32", "window:i32", "softcap:f32"], _ATT, "attention_flash",
       "attention.attention_reference",
       ("bf16", (4, 8, 8))),
    _k("attn_online_softmax_f32", "attention.cc", ["s:f32*", "p:bf16*", "m:f32*", "l:f32*", "o:f32*"],
       _ATT, "attention_flash", "attention.attention_reference"),
    _k("attn_pv_bf16_f32", "attention.cc", ["p:bf16*", "v:bf16*", "o:f32*"], _ATT,
       "attention_flash", "attention.attention_reference", ("bf16", (4, 8, 8))),
    _k("attn_finalize_f32", "attention.cc", ["o:f32*", "l:f32*", "out:f32*"], ("ATT_TQ", "ATT_D"),
       "attention_flash", "attention.attention_reference"),
]
_IR_ATT = "attention.attention_reference (as the array IR's work item)"
_SPECS += [
    _k("attn_init_f32", "attention.cc", ["o:f32*", "ml:f32*", "state:i32*"], ("ATT_TQ", "ATT_D"),
       "attention_item", _IR_ATT),
    _k("attn_q_bf16", "attention.cc", ["kv:bf16*", "q:bf16*", "state:i32*"], ("ATT_TQ", "ATT_D"),
       "attention_item", _IR_ATT),
    _k("attn_tile_bf16", "attention.cc",
       ["q:bf16*", "kv:bf16*", "s:f32*", "p:bf16*", "o:f32*", "ml:f32*", "state:i32*",
        "kv_len:i32", "q_offset:i32", "scale:f32", "core:i32", "cores:i32", "q_tiles:i32",
        "tq:i32", "group:i32", "causal:i32", "window:i32", "softcap:f32"], _ATT,
       "attention_item", _IR_ATT, ("bf16", (4, 8, 8))),
    _k("attn_finish_f32", "attention.cc", ["o:f32*", "ml:f32*", "state:i32*"], ("ATT_TQ", "ATT_D"),
       "attention_item", _IR_ATT),
    _k("attn_q_masked_bf16", "attention.cc", ["kvm:u8*", "q:bf16*", "state:i32*"],
       ("ATT_TQ", "ATT_D"), "attention_item", _IR_ATT),
    _k("attn_tile_masked_bf16", "attention.cc",
       ["q:bf16*", "kvm:u8*", "s:f32*", "p:bf16*", "o:f32*", "ml:f32*", "state:i32*",
        "kv_len:i32", "q_offset:i32", "scale:f32", "core:i32", "cores:i32", "q_tiles:i32",
        "tq:i32", "group:i32", "causal:i32", "window:i32", "softcap:f32", "mask_kind:i32"], _ATT,
       "attention_item", _IR_ATT + "; mask tile in the element", ("bf16", (4, 8, 8))),
]
# token embedding rows (embed.cc): embed_<precision>_f32(row, out, group, scale), the row in the
# stored precision (bytes of values then bf16 scales for int8 / int4), kernels/lower/dma.py
EMBED_PRECISIONS = ("fp32", "bf16", "int8", "int4")
for _p in EMBED_PRECISIONS:
    _SPECS.append(_k(f"embed_{_p}_f32", "embed.cc",
                     ["row:f32*" if _p == "fp32" else "row:u8*", "out:f32*", "group:i32", "scale:f32"],
                     ("EMB_H",), "embed_row", "blocks.llm.EmbedDesign (weights.dequantize x bf16(scale))"))
KERNELS: dict[str, KernelSpec] = {s.symbol: s for s in _SPECS}
SOURCES: tuple[str, ...] = tuple(sorted({s.source for s in _SPECS}))


# --- the array IR's view of the table: signatures and object files ------------------------------
def generated(symbol: str, arg_types, chain) -> tuple[str, KernelSpec] | None:
    """(C++ source, spec) of a kernel generated at build time (fused chains: chain_gen.py, from
    the program's notes["chain"]), or None for table kernels."""
    if symbol in KERNELS or chain is None or not symbol.startswith("chain_"):
        return None
    from torch_xdna.array.ir import KernelDecl
    from torch_xdna.kernels.aie.chain_gen import chain_source
    return chain_source(KernelDecl(symbol, f"{symbol}.o", tuple(arg_types)), chain)


def check_decl(symbol: str, arg_types, chain=None) -> KernelSpec:
    """The table entry of `symbol` (or the generated chain kernel, given the program's chain
    note) if the IR's argument list matches it exactly (count, pointer or scalar, element
    type); else KernelContractError naming both signatures."""
    gen = generated(symbol, arg_types, chain)
    spec = gen[1] if gen else KERNELS.get(symbol)
    if spec is None:
        raise KernelContractError(f"core kernel {symbol!r} has no C++ source in "
                                  f"torch_xdna/kernels/aie/{ARCH}/ ({len(KERNELS)} symbols known)")
    ir_sig = ir_signature(arg_types)
    c_sig = tuple(t for _, t in spec.args)
    if ir_sig != c_sig:
        raise KernelContractError(
            f"core kernel {symbol}: the array IR calls it as ({', '.join(ir_sig)}) but "
            f"{spec.source} declares ({', '.join(f'{t} {n}' for n, t in spec.args)})")
    return spec


def object_files(decls, chain=None) -> dict[str, tuple[str, str, tuple[tuple[str, int], ...]]]:
    """symbol -> (object file, source, -D defines) for a program's kernel declarations.

    One object per source: every extern "C" symbol of a source is in each object compiled from
    it, so two objects of one source linked into one core would define each symbol twice. The
    defines of the symbols of one source are merged (they come from the same tile shapes); two
    declarations that need one define at different values are refused. Symbols the table does
    not know, or whose arguments do not match it, keep `<symbol>.o` (check_decl reports them)."""
    by_src: dict[str, dict[str, int]] = {}
    known = set()
    for d in decls:
        spec = KERNELS.get(d.symbol)
        if spec is None or ir_signature(d.arg_types) != tuple(t for _, t in spec.args):
            continue
        known.add(d.symbol)
        defs = spec.tile_defines([None if isinstance(t, str) else t.shape for t in d.arg_types])
        merged = by_src.setdefault(spec.source, {})
        for k, v in defs.items():
            if merged.setdefault(k, v) != v:
                raise KernelContractError(
                    f"core kernel {d.symbol}: {spec.source} is needed with {k}={v} and "
                    f"{k}={merged[k]} in one program; one object per source cannot hold both")
    out = {}
    for d in decls:
        spec = KERNELS.get(d.symbol)
        if spec is None and chain is not None and d.symbol.startswith("chain_"):
            out[d.symbol] = (f"{d.symbol}.o", f"{d.symbol}.cc", ())    # generated, one per chain
            continue
        if d.symbol not in known:
            out[d.symbol] = (f"{d.symbol}.o", spec.source if spec else "", ())
            continue
        defs = tuple(sorted(by_src[spec.source].items()))
        stem = spec.source.rsplit(".", 1)[0]
        tag = "".join(f"_{k.split('_', 1)[-1].lower()}{v}" for k, v in defs)
        out[d.symbol] = (f"{stem}{tag}.o", spec.source, defs)
    return out


def _mult(**m):
    return [(f"{k} a multiple of {v}", (lambda k, v: lambda d: d.get(k, v) % v == 0)(k, v))
            for k, v in m.items()]


# the matmul sources' tile multiples (their static_asserts), which GEMM plans must respect
MATMUL_TILE_MULTIPLES = {
    "mm.cc": dict(DIM_M=4, DIM_K=8, DIM_N=8),
    "mm_i8.cc": dict(DIM_M=8, DIM_K=16, DIM_N=16),
    "mm_bfp16.cc": dict(DIM_M=8, DIM_K=8, DIM_N=8),
    "wq.cc": dict(DIM_M=4, DIM_K=32, DIM_N=8),        # includes xdna_mm.h's bf16 matmul
}


def matmul_tile_multiples(compute_dtype: str) -> tuple[int, int, int]:
    """(M, K, N) multiples the core kernel of a full GEMM in `compute_dtype` compiles for."""
    src = {"int8": "mm_i8.cc", "bfp16": "mm_bfp16.cc"}.get(compute_dtype, "mm.cc")
    m = MATMUL_TILE_MULTIPLES[src]
    return m["DIM_M"], m["DIM_K"], m["DIM_N"]


# the compile-time tile rules of each source (its static_asserts): one object holds every symbol
# of its source, so a rule of any of them applies to the object
TILE_RULES = {
    **{src: _mult(**m) for src, m in MATMUL_TILE_MULTIPLES.items()},
    "zero.cc": [("DIM_M * DIM_N a multiple of 16", lambda d: d.get("DIM_M", 32) * d.get("DIM_N", 32) % 16 == 0)],
    "attention.cc": _mult(ATT_TQ=4, ATT_TKV=16, ATT_D=16),
}


def tile_errors(source: str, defines) -> list[str]:
    """The tile rules of `source` that `defines` ((name, value) pairs) break."""
    d = dict(defines)
    return [f"{what} ({', '.join(f'{k}={v}' for k, v in sorted(d.items()))})"
            for what, ok in TILE_RULES.get(source, ()) if not ok(d)]
