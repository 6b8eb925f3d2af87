"""The array IR's core-kernel calls and the C++ kernels agree exactly.

For representative designs of every lowering family (tests/test_array_ir.py's designs, the
catalog's, and the forms those miss: packed / separate two-input units, norms with and without
parameters, bf16 rows, the gated GEMM, weight-only GEMV), each KernelDecl must name a symbol of
kernels/aie KERNELS with exactly its argument list (count, pointer or scalar, element type), each
Call must pass values of those types, and the object files must be one per source + defines.
Every C++ kernel those designs use is then run on the host (g++ against the aie_api emulation)
against its golden, and a few whole designs run at the transaction level with the C++ kernels in
place of the torch references. Host emulation only: nothing here ran on an NPU.
"""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest
import torch

import torch_xdna.kernels.aie.refs  # noqa: F401  (registers the core-kernel references)
from torch_xdna.array import ir
from torch_xdna.hw import NPU4
from torch_xdna.kernels import aie
from torch_xdna.kernels.toolchain import catalog
from torch_xdna.kernels.aie import KERNELS, golden, host_build
from torch_xdna.kernels.toolchain.build import BuildError, kernel_objects
from torch_xdna.kernels.ops.fused import ChainDesign, GatedGemmDesign
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.ops.vector import VectorDesign
from test_array_ir import DESIGNS as IR_DESIGNS, lowered

F32, BF16 = torch.float32, torch.bfloat16
EXTRA = [
    VectorDesign("mul", ((5000,), (5000,)), (BF16, BF16), (5000,), BF16),     # packed (4 cores/col)
    VectorDesign("sub", ((100,), (100,)), (F32, F32), (100,), F32),           # separate (1 core)
    VectorDesign("maximum", ((64, 32), (32,)), (F32, F32), (64, 32), F32),    # resident broadcast
    VectorDesign("softmax", ((8, 100),), (F32,), (8, 100), BF16),
    VectorDesign("rms_norm", ((4, 256), (256,)), (BF16, BF16), (4, 256), BF16,
                 (("eps", 1e-6), ("has_weight", True), ("weight_offset", 1.0))),
    VectorDesign("rms_norm", ((4, 128),), (F32,), (4, 128), F32, (("eps", 1e-6), ("has_weight", False))),
    VectorDesign("layer_norm", ((6, 64), (64,)), (BF16, BF16), (6, 64), F32,
                 (("eps", 1e-5), ("has_bias", False), ("has_weight", True), ("norm_dims", 1))),
    VectorDesign("layer_norm", ((6, 64),), (F32,), (6, 64), F32,
                 (("eps", 1e-5), ("has_bias", False), ("has_weight", False), ("norm_dims", 1))),
    GemmDesign(1, 256, 200, dtype="int8", w_group=64),                         # GEMV, int8 weights
    GemmDesign(8, 64, 96, residual=True, out_dtype=BF16),                      # residual only
    GatedGemmDesign(m=4, k=64, n=96, dtype="bf16"),
    ChainDesign(((3000,), (3000,)), ("bfloat16", "bfloat16"),          # two streamed, packed
                (("mul", (("in", 0), ("in", 1)), ()), ("mul", (("s", 0), 0.5), ()),
                 ("exp", (("s", 1),), ()), ("sub", (("s", 2), ("in", 0)), ())), (3, 1), ("float32", "bfloat16")),
]
EXTRA.append(__import__("test_txn_layer").layer(1))            # the fused layer's 12 stages
CATALOG = [catalog.example(n, "64x64x64" if n.startswith("gemm") else
                           "32x256" if n == "softmax" else "1024").design for n in catalog.DESIGNS]
DESIGNS = IR_DESIGNS + EXTRA + CATALOG
CHAIN = re.compile(r"chain_[0-9a-f]{10}$")    # generated per chain (kernels/aie/chain_gen.py)


@lru_cache(maxsize=None)
def programs(i: int):
    d = DESIGNS[i]
    return lowered(d) if i < len(IR_DESIGNS) else lower(d, NPU4)


def _walk(body):
    for op in body:
        if isinstance(op, ir.Call):
            yield op
        elif isinstance(op, ir.Loop):
            yield from _walk(op.body)


def _arg_type(prog, a):
    """What a Call passes: a TensorType for buffers, the scalar dtype for scalars."""
    if isinstance(a, ir.FifoElem):
        return prog.fifo(a.fifo).elem
    if isinstance(a, ir.BufferRef):
        return prog.buffer(a.name).type
    if isinstance(a, ir.Const):
        return a.dtype
    scal = {s.name: s.dtype for s in prog.sequence.scalars}
    return scal[a.name] if a.name in scal else prog.buffer(a.name).type.dtype


def used_symbols() -> set[str]:
    return {k.symbol for i in range(len(DESIGNS)) for p in programs(i) for k in p.kernels}


@pytest.mark.parametrize("i", range(len(DESIGNS)), ids=lambda i: DESIGNS[i].name)
def test_every_call_matches_its_cpp_signature(i, tmp_path):
    for prog in programs(i):
        decls = {k.symbol: k for k in prog.kernels}
        chain = dict(prog.notes).get("chain")
        for k in prog.kernels:
            aie.check_decl(k.symbol, k.arg_types, chain)       # count, pointer/scalar, dtype
        for core in prog.cores:
            for c in _walk(core.body):
                want = decls[c.kernel].arg_types
                got = tuple(_arg_type(prog, a) for a in c.args)
                assert got == want, (prog.name, core.tile.name, c.kernel)
        objs = kernel_objects(prog, "aie2p", gen_dir=tmp_path)  # + tile rules, generated sources
        for core in prog.cores:                      # one object per source in each core
            assert len(set(core.link_with)) == len(core.link_with)
            assert set(core.link_with) <= set(objs)
            srcs = [objs[o][0] for o in core.link_with]
            assert len(set(srcs)) == len(srcs), (prog.name, core.link_with)


def test_object_files_are_per_source_and_defines():
    d = next(d for d in IR_DESIGNS if d.kind == "attention")
    prog = lowered(d)[0]
    objs = {k.object_file for k in prog.kernels}
    assert len(objs) == 1 and objs.pop().startswith("attention_d")     # four symbols, one .o
    (src, defines), = kernel_objects(prog, "aie2p").values()
    assert src.name == "attention.cc" and {x.split("=")[0] for x in defines} == \
        {"-DATT_TQ", "-DATT_TKV", "-DATT_D"}
    gemm = lower(GemmDesign(64, 64, 64), NPU4)[0]
    assert sorted(k.object_file.split("_")[0] for k in gemm.kernels) == ["mm", "store", "zero"]


def test_build_refuses_a_mismatched_declaration():
    import dataclasses
    prog = lower(VectorDesign("silu", ((512,),), (BF16,), (512,), F32), NPU4)[0]
    k = prog.kernels[0]
    cases = {"count": k.arg_types[:-1], "scalar": k.arg_types[:-1] + (k.arg_types[0],),
             "dtype": (ir.TensorType(k.arg_types[0].shape, "f32"),) + k.arg_types[1:]}
    for what, types in cases.items():
        bad = dataclasses.replace(prog, kernels=(dataclasses.replace(k, arg_types=types),))
        with pytest.raises(BuildError) as e:
            kernel_objects(bad, "aie2p")
        msg = str(e.value)
        assert k.symbol in msg and "eltwise.cc declares (x:bf16*" not in msg, what
        assert "the array IR calls it as (" in msg and "declares (bf16* x, f32* out, i32 n)" in msg
    dup = dataclasses.replace(prog, kernels=(dataclasses.replace(k, object_file="silu.o"),))
    with pytest.raises(BuildError, match="one per source"):
        kernel_objects(dup, "aie2p")


# --- the C++ kernels the designs use, on the host, against their goldens -------------------------
MAIN = {"DIM_M": 32, "DIM_K": 64, "DIM_N": 32, "ATT_TQ": 8, "ATT_TKV": 16, "ATT_D": 32}
# symbols whose host checks live in tests/test_aie_kernels.py (test name there)
ELSEWHERE = {
    r"zero_(f32|i32)": "test_matmul_bf16_f32_bit_exact",
    r"matmul_(bf16_f32|i8_i32)": "test_matmul_i8_i32_exact",
    r"matmul_bf16_bfp16_f32": "test_matmul_bfp16_bit_exact",
    r"(matmul|gemv)_int[48]_bf16": "test_weight_only_tile_bit_exact",
    r"store_\w+_f32_(f32|bf16)|store_none_i32_i32": "test_store_kernels",
    r"attn_(init_f32|q_bf16|tile_bf16|finish_f32)": "test_ir_attention_work_item",
    r"qk_norm_rope_bf16": "test_qk_norm_rope",
    r"qk_rope_bf16": "test_qk_rope",
    r"rope_bf16_f32": "test_rope_equals_llm_blocks",
    r"silu_mul_bf16_f32": "test_silu_mul",
    r"gelu_tanh_mul_bf16_f32": "test_gelu_tanh_mul",
    r"cast_f32_bf16": "test_cast_f32_bf16_rounds_to_nearest_even_and_flushes",
    r"embed_(fp32|bf16|int8|int4)_f32": "test_embed_rows_equal_golden_and_embed_design",
}
DT = {"f32": F32, "bf16": BF16, "i32": torch.int32}


@pytest.fixture(scope="module")
def lib():
    if host_build.find_compiler() is None:
        pytest.skip("no host C++ compiler (g++) to build the AIE kernels")
    cdll = host_build.load(aie.SOURCES, MAIN)
    return lambda sym: host_build.bind(cdll, sym)


def _rand(n, dt, g, scale=3.0):
    if dt == torch.int32:
        return torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), dtype=torch.int32, generator=g)
    return (torch.randn(n, generator=g) * scale).to(dt)


def _bits(x):
    return x.float().view(torch.int32) if x.dtype != torch.int32 else x


def test_used_symbols_are_host_tested():
    """Every symbol the designs use is either checked below or in test_aie_kernels.py."""
    here = re.compile(r"(add|sub|mul|div|maximum|minimum|gate_mul)(_pk)?_(f32|bf16|i32)_(f32|bf16|i32)"
                      r"|(softmax|layer_norm(_w|_nw)?|rms_norm(_nw)?)_(f32|bf16)_(f32|bf16)"
                      r"|epilogue_\w+|attn_(q|tile)_masked_bf16"
                      r"|(neg|relu|abs|exp|sigmoid|silu|tanh|gelu|gelu_tanh|reciprocal|sqrt|rsqrt"
                      r"|square)_(f32|bf16)_(f32|bf16)$")
    other = (Path(__file__).with_name("test_aie_kernels.py")).read_text()
    for sym in sorted(used_symbols()):
        if CHAIN.match(sym) or here.fullmatch(sym):
            continue
        test = next((t for pat, t in ELSEWHERE.items() if re.fullmatch(pat, sym)), None)
        assert test is not None and f"def {test}(" in other, f"{sym} is not host-tested"


@pytest.mark.parametrize("sym", sorted(s for s in KERNELS if KERNELS[s].source == "binary.cc")
                         + ["mul_bf16_f32", "div_bf16_f32"])
def test_binary_units(lib, sym):
    parts = sym.split("_")
    op = "_".join(p for p in parts[:-2] if p != "pk")
    tin, tout = DT[parts[-2]], DT[parts[-1]]
    g = torch.Generator().manual_seed(len(sym))
    n = 77
    a, b = _rand(n, tin, g), _rand(n, tin, g)
    if op == "div":
        b = torch.where(b.float().abs() < 0.1, torch.ones_like(b), b)
    out = torch.empty(n, dtype=tout)
    if "_pk_" in sym:
        lib(sym)(torch.cat([a, b]), out, n)
    else:
        lib(sym)(a, b, out, n)
    want = golden.binary(op, a, b, tout)
    assert torch.equal(_bits(out), _bits(want)), sym
    if op in ("add", "sub", "maximum", "minimum", "mul"):      # and vector.OPS, bit for bit
        ref = torch.empty(n, dtype=tout)
        VectorDesign(op, ((n,), (n,)), (tin, tin), (n,), tout).reference([a, b], [ref])
        assert torch.equal(_bits(out), _bits(ref)), sym


@pytest.mark.parametrize("op", ["neg", "relu", "abs", "exp", "sigmoid", "silu", "tanh", "gelu",
                                "gelu_tanh", "reciprocal", "sqrt", "rsqrt", "square"])
def test_unit_kernels_all_dtypes(lib, op):
    exact = op in aie.UNIT_OPS_EXACT
    g = torch.Generator().manual_seed(3)
    for tin in (F32, BF16):
        for tout in (F32, BF16):
            x = _rand(50, tin, g)
            if op in ("sqrt", "rsqrt"):
                x = x.abs() + 0.5
            out = torch.empty(50, dtype=tout)
            sym = f"{op}_{'f32' if tin == F32 else 'bf16'}_{'f32' if tout == F32 else 'bf16'}"
            lib(sym)(x, out, 50)
            want = golden.unit(op, x, tout, exact)
            assert torch.equal(_bits(out), _bits(want)), sym


ROW_SHAPES = [(3, 50), (2, 64), (1, 300)]


@pytest.mark.parametrize("rows,n", ROW_SHAPES)
@pytest.mark.parametrize("tin,tout", [(F32, F32), (F32, BF16), (BF16, F32), (BF16, BF16)])
def test_row_units(lib, rows, n, tin, tout):
    g = torch.Generator().manual_seed(rows * n)
    x = _rand(rows * n, tin, g).reshape(rows, n) + 1
    x[0, 0] = 30.0
    w, b = _rand(n, tin, g, 1.0), _rand(n, tin, g, 1.0)
    tn = lambda t: "f32" if t == F32 else "bf16"   # noqa: E731
    work = [torch.empty(n)] if tin == BF16 else []
    op_ = golden.row_operand
    cases = {
        "softmax": ([], (), golden.softmax(op_(x))),
        "layer_norm": ([torch.cat([w, b])], (1e-5,), golden.layer_norm(op_(x), op_(w), op_(b), 1e-5)),
        "layer_norm_w": ([w], (1e-5,), golden.layer_norm(op_(x), op_(w), None, 1e-5)),
        "layer_norm_nw": ([], (1e-5,), golden.layer_norm(op_(x), None, None, 1e-5)),
        "rms_norm": ([w], (1e-6, 1.0), golden.rms_norm(op_(x), op_(w), 1e-6, 1.0)),
        "rms_norm_nw": ([], (1e-6, 0.0), golden.rms_norm(op_(x), None, 1e-6)),
    }
    for name, (par, scal, want) in cases.items():
        sym = f"{name}_{tn(tin)}_{tn(tout)}"
        out = torch.empty(rows, n, dtype=tout)
        lib(sym)(x.contiguous(), *par, out, *work, rows, n, *scal)
        assert torch.equal(_bits(out), _bits(golden.row_out(want, tout))), sym


@pytest.mark.parametrize("act", aie.STORE_ACTS)
def test_epilogue_units(lib, act):
    g = torch.Generator().manual_seed(7)
    rows, cols = 3, 40
    n = rows * cols
    t, r = torch.randn(rows, cols, generator=g) * 2, torch.randn(rows, cols, generator=g)
    bias = torch.randn(cols, generator=g).to(BF16)
    for out_n, tout in (("f32", F32), ("bf16", BF16)):
        for form in ("", "_bias", "_res", "_res_pk", "_bias_res_pk"):
            sym = f"epilogue_{act}{form}_f32_{out_n}"
            out = torch.empty(rows, cols, dtype=tout)
            bufs = [torch.cat([t.flatten(), r.flatten()])] if "pk" in form else [t]
            if form == "_res":
                bufs.append(r)
            if "bias" in form:
                bufs.append(bias)
            lib(sym)(*bufs, out, n, cols, 0.5)
            want = golden.epilogue(t, bias if "bias" in form else None, r if "res" in form else None,
                                   0.5, act, tout)
            assert torch.equal(_bits(out), _bits(want)), sym


@pytest.mark.parametrize("src,dims", [("mm.cc", (4, 16, 8)), ("mm.cc", (12, 8, 24)),
                                      ("mm_i8.cc", (8, 32, 16)), ("mm_bfp16.cc", (8, 16, 8))])
def test_matmul_small_tiles(src, dims):
    """The one-block paths for the plans' small-M / narrow tiles (not whole 2x2 expansions)."""
    if host_build.find_compiler() is None:
        pytest.skip("no host C++ compiler")
    m, k, n = dims
    cdll = host_build.load([src], {"DIM_M": m, "DIM_K": k, "DIM_N": n})
    g = torch.Generator().manual_seed(m * k)
    c0 = torch.randn(m, n, generator=g)
    if src == "mm_i8.cc":
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
        b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
        c = torch.randint(-1000, 1000, (m, n), dtype=torch.int32, generator=g)
        want = golden.matmul_rowmajor(a, b, c)
        host_build.bind(cdll, "matmul_i8_i32")(a, b, c)
    elif src == "mm.cc":
        a, b = torch.randn(m, k, generator=g).to(BF16), torch.randn(k, n, generator=g).to(BF16)
        c = c0.clone()
        want = golden.matmul_rowmajor(a, b, c0)
        host_build.bind(cdll, "matmul_bf16_f32")(a, b, c)
    else:
        a, b = torch.randn(m, k, generator=g).to(BF16), torch.randn(k, n, generator=g).to(BF16)
        c = c0.clone()
        want = golden.matmul_bfp16(a, b, c0)
        host_build.bind(cdll, "matmul_bf16_bfp16_f32")(a, golden.bfp16_weight(b), c)
    assert torch.equal(_bits(c), _bits(want))


@pytest.mark.parametrize("kind", [1, 2])
def test_masked_attention_tile(lib, kind):
    """attn_q_masked / attn_tile_masked on one work item: [K | V | mask] bytes per key tile."""
    rows, tkv, d = MAIN["ATT_TQ"], MAIN["ATT_TKV"], MAIN["ATT_D"]
    g = torch.Generator().manual_seed(kind)
    s_len = 40
    pk = -(-s_len // tkv) * tkv
    q = (torch.randn(rows, d, generator=g) * 2).to(BF16)
    k = torch.zeros(pk, d, dtype=BF16)
    v = torch.zeros(pk, d, dtype=BF16)
    k[:s_len] = (torch.randn(s_len, d, generator=g) * 2).to(BF16)
    v[:s_len] = torch.randn(s_len, d, generator=g).to(BF16)
    if kind == 1:
        mask = torch.randn(rows, pk, generator=g)
        mask[:, 5] = float("-inf")
    else:
        mask = torch.rand(rows, pk, generator=g) > 0.3
    o, ml, state = torch.empty(rows, d), torch.empty(rows, 2), torch.zeros(2, dtype=torch.int32)
    qb, s, p = torch.empty(rows, d, dtype=BF16), torch.empty(rows, tkv), torch.empty(rows, tkv, dtype=BF16)

    def element(j):
        kv = torch.stack([k[j * tkv:(j + 1) * tkv], v[j * tkv:(j + 1) * tkv]]).contiguous()
        mt = mask[:, j * tkv:(j + 1) * tkv].contiguous()
        mt = mt.view(torch.uint8) if kind == 1 else mt.to(torch.uint8)
        return torch.cat([kv.view(torch.uint8).flatten(), mt.flatten()])

    lib("attn_init_f32")(o, ml, state)
    first = element(0).clone()
    first[:rows * d * 2] = q.view(torch.uint8).flatten()
    lib("attn_q_masked_bf16")(first, qb, state)
    assert torch.equal(qb, q)
    for j in range(pk // tkv):
        lib("attn_tile_masked_bf16")(qb, element(j), s, p, o, ml, state, s_len, s_len - rows, 0.125, 0, 1, 1,
                                     rows, 1, 1, 0, 0.0, kind)
    lib("attn_finish_f32")(o, ml, state)
    want = golden.attention_item(q, k, v, kv_len=s_len, q_offset=s_len - rows, t0=0, tq=rows,
                                 scale=0.125, tkv=tkv, causal=True,
                                 mask_add=mask if kind == 1 else None,
                                 mask_keep=mask if kind == 2 else None)
    assert torch.equal(_bits(o), _bits(want))


# --- whole designs at the transaction level with the C++ kernels in place of the references ------
def _cpp_registry(progs, gen_dir):
    """symbol -> host C++ callable for every kernel of a launch's programs, from one library
    built with the programs' tile defines (kernels/aie.object_files; chains generated)."""
    sources, defines = set(), {}
    for p in progs:
        for src, defs in kernel_objects(p, "aie2p", gen_dir=gen_dir).values():
            defs = [tuple(x[2:].split("=")) for x in defs]
            defs = [(k, int(v)) for k, v in defs]
            sources.add(str(src))
            for k, v in defs:
                assert defines.setdefault(k, v) == v, (k, v, defines[k])
    cdll = host_build.load(sorted(sources), defines)
    out = {}
    for p in progs:
        chain = dict(p.notes).get("chain")
        for k in p.kernels:
            g = aie.generated(k.symbol, k.arg_types, chain)
            out[k.symbol] = _bind_spec(cdll, g[1]) if g else host_build.bind(cdll, k.symbol)
    return out


def _bind_spec(cdll, spec):
    """host_build.bind for a generated kernel (not in KERNELS)."""
    import ctypes
    fn = getattr(cdll, spec.symbol)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p if t.endswith("*") else
                   (ctypes.c_int32 if t == "i32" else ctypes.c_float) for _, t in spec.args]

    def call(*args):
        assert len(args) == len(spec.args)
        conv = []
        for (_, t), a in zip(spec.args, args):
            if t.endswith("*"):
                assert a.is_contiguous() and str(a.dtype).endswith(
                    {"f32*": "float32", "bf16*": "bfloat16"}.get(t, t)), (spec.symbol, t, a.dtype)
                conv.append(a.data_ptr())
            else:
                conv.append(a)
        fn(*conv)
    return call


EXACT_E2E = [
    (VectorDesign("add", ((1000,), (1000,)), (F32, F32), (1000,), F32), "packed"),
    (VectorDesign("sub", ((100,), (100,)), (F32, F32), (100,), F32), "separate"),
    (VectorDesign("maximum", ((64, 32), (32,)), (F32, F32), (64, 32), F32), "resident"),
    (VectorDesign("mul", ((5000,), (5000,)), (BF16, BF16), (5000,), BF16), "packed bf16"),
    (VectorDesign("relu", ((3000,),), (F32,), (3000,), F32), "unit"),
    (GemmDesign(64, 96, 80, dtype="int8", out_dtype=torch.int32), "int8 gemm, 8-row tiles"),
    (ChainDesign(((64, 96), (96,)), ("float32", "float32"),               # resident broadcast
                 (("add", (("in", 0), ("in", 1)), ()), ("relu", (("s", 0),), ()),
                  ("maximum", (("s", 1), ("in", 0)), ())), (2,), ("float32",)), "exact chain"),
]
BOUNDED_E2E = [
    (VectorDesign("softmax", ((64, 500),), (BF16,), (64, 500), F32, (("dim", -1),)), 8),
    (VectorDesign("rms_norm", ((8, 1024), (1024,)), (F32, F32), (8, 1024), F32,
                  (("eps", 1e-6), ("has_weight", True))), 8),
    (VectorDesign("layer_norm", ((16, 768), (768,), (768,)), (F32,) * 3, (16, 768), F32,
                  (("eps", 1e-5), ("has_bias", True), ("has_weight", True), ("norm_dims", 1))), 256),
    (GemmDesign(8, 64, 96, bias=True, residual=True, epilogue="relu"), 64),
    (GemmDesign(36, 100, 52), 128),                        # 16 x 64 x 8 tiles, K and M edges
    (IR_DESIGNS[12], 8),                                    # chain add + silu (torch silu vs poly)
]


def _inputs(d, g):
    if isinstance(d, ChainDesign):
        return [(torch.randn(s, generator=g) * 2).to(getattr(torch, dt))
                for s, dt in zip(d.in_shapes, d.in_dtypes)]
    out = []
    for s, dt in zip(d.in_shapes if hasattr(d, "in_shapes") else (), getattr(d, "in_dtypes", ())):
        out.append((torch.randn(s, generator=g) * 2).to(dt))
    if isinstance(d, GemmDesign):
        if d.dtype == "int8":
            out = [torch.randint(-128, 128, s, dtype=torch.int8, generator=g) for s in ((d.m, d.k), (d.k, d.n))]
        else:
            out = [torch.randn(s, generator=g) for s in ((d.m, d.k), (d.k, d.n))]
            if d.bias:
                out.append(torch.randn(d.n, generator=g))
            if d.residual:
                out.append(torch.randn(d.m, d.n, generator=g))
    return out


def _run_cpp(d, monkeypatch, ins, out_shape, out_dtype, gen_dir):
    from torch_xdna.runtime.sim import core_kernels, txn_level
    func = torch.zeros(out_shape, dtype=out_dtype)
    d.reference(ins, [func])
    cpp = core_kernels.KernelRegistry("host C++ kernel")
    for symbol, fn in _cpp_registry(lower(d, NPU4), gen_dir).items():
        cpp.register(symbol, fn)
    monkeypatch.setattr(core_kernels, "lookup", cpp.lookup)
    txn = torch.zeros(out_shape, dtype=out_dtype)
    txn_level.TxnRunner(NPU4).run(d, ins, [txn], {})
    return func, txn


def _out(d):
    if isinstance(d, ChainDesign):
        return d.in_shapes[0], getattr(torch, d.out_dtypes[0])
    if isinstance(d, GemmDesign):
        return (d.m, d.n), d.out_dtype
    return tuple(d.out_shape), d.out_dtype


@pytest.mark.parametrize("d,what", EXACT_E2E, ids=[w for _, w in EXACT_E2E])
def test_txn_with_cpp_kernels_bit_identical(lib, d, what, monkeypatch, tmp_path):
    """The IR's calls drive the C++ kernels (argument order, packing, Consts) at the transaction
    level: integer and exact elementwise designs equal the functional level bit for bit."""
    g = torch.Generator().manual_seed(11)
    ins = _inputs(d, g)
    func, txn = _run_cpp(d, monkeypatch, ins, *_out(d), tmp_path)
    assert torch.equal(_bits(func), _bits(txn)), what


@pytest.mark.parametrize("d,ulp", BOUNDED_E2E, ids=lambda x: getattr(x, "name", str(x)))
def test_txn_with_cpp_kernels_within_bound(lib, d, ulp, monkeypatch, tmp_path):
    """Float reductions and polynomial transcendentals: the C++ kernels' lane-order sums and
    xdna_vec.h polynomials against torch's, within `ulp` fp32 ulps of the result's magnitude
    (docs/kernels.md bounds; layer_norm's two-pass variance and the GEMM's K-ordered fp32 sums
    get the wider ones)."""
    g = torch.Generator().manual_seed(5)
    ins = _inputs(d, g)
    func, txn = _run_cpp(d, monkeypatch, ins, *_out(d), tmp_path)
    scale = float(func.abs().max()) + 1.0
    assert float((func.float() - txn.float()).abs().max()) <= ulp * 2.0 ** -23 * scale


@pytest.mark.parametrize("i", [i for i, d in enumerate(DESIGNS) if d.kind == "chain"],
                         ids=lambda i: DESIGNS[i].name)
def test_generated_chain_kernels_bit_exact(i, tmp_path):
    """chain_<hash> generated from the steps, compiled on the host, against golden.chain on
    unit-length inputs in the IR's argument form (packed parts, repeated residents)."""
    if host_build.find_compiler() is None:
        pytest.skip("no host C++ compiler")
    prog = programs(i)[0]
    chain = dict(prog.notes)["chain"]
    decl = next(k for k in prog.kernels if CHAIN.match(k.symbol))
    src, spec = aie.generated(decl.symbol, decl.arg_types, chain)
    path = tmp_path / spec.source
    path.write_text(src)
    fn = _bind_spec(host_build.load([path]), spec)
    in_shapes, in_dtypes, steps, outputs, out_dtypes = chain
    n = 50
    g = torch.Generator().manual_seed(i)
    xs = [(torch.randn(n, generator=g) * 2).to(getattr(torch, dt)) for dt in in_dtypes]
    from torch_xdna.kernels.aie.chain_gen import _layout
    groups, resident, _ = _layout(decl, chain)
    bufs = [torch.cat([xs[j] for j in grp]) for grp in groups]
    if resident:
        bufs.append(torch.cat([xs[j] for j in resident]))
    outs = [torch.empty(n, dtype=getattr(torch, dt)) for dt in out_dtypes]
    fn(*bufs, *outs, n)
    for got, want, dt in zip(outs, golden.chain(steps, outputs, xs), out_dtypes):
        want = golden.row_out(want, getattr(torch, dt))
        assert torch.equal(_bits(got), _bits(want)), decl.symbol
