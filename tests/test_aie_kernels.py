"""The AIE core kernels (torch_xdna/kernels/aie/aie2p/*.cc) compiled for the host against the
aie_api emulation and checked against their goldens.

Bit-exact against kernels/aie/golden.py (the project's numerics in the kernel's operation order)
for every kernel; additionally against the project's own references (vector.OPS, GemmDesign,
attention_reference, llm_blocks): bit-exact where the order cannot matter (integer, elementwise
without transcendentals, RoPE), else within the bound docs/kernels.md states. Host emulation
only: nothing here ran on an NPU or through Peano/Chess.
"""
from __future__ import annotations

import math

import pytest
import torch

from torch_xdna.kernels import numerics, quant
from torch_xdna.kernels.aie import KERNELS, SOURCES, golden, host_build
from torch_xdna.kernels.ops.attention import attention_reference
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.blocks.toolkit import rope as _rope
from torch_xdna.kernels.ops.vector import VectorDesign

pytestmark = pytest.mark.skipif(host_build.find_compiler() is None,
                                reason="no host C++ compiler (g++) to build the AIE kernels")

MAIN = {"DIM_M": 32, "DIM_K": 64, "DIM_N": 32, "ATT_TQ": 8, "ATT_TKV": 16, "ATT_D": 32}
SMALL_MM = {"DIM_M": 16, "DIM_K": 16, "DIM_N": 16}  # the smallest int8 tile (8x8x8, 2x2)
WIDE_WQ = {"DIM_M": 8, "DIM_K": 256, "DIM_N": 16}


class Lib:
    def __init__(self, sources, defines):
        self.defines = defines
        self.cdll = host_build.load(sources, defines)

    def __getattr__(self, symbol):
        return host_build.bind(self.cdll, symbol)


@pytest.fixture(scope="session")
def lib():
    return Lib(SOURCES, MAIN)


@pytest.fixture(scope="session")
def small(lib):
    return Lib(["mm.cc", "mm_i8.cc", "mm_bfp16.cc"], SMALL_MM)


@pytest.fixture(scope="session")
def wide(lib):
    return Lib(["wq.cc"], WIDE_WQ)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float().contiguous(), b.float().contiguous()
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def assert_bits(got, want, what):
    if not bits_equal(got, want):
        diff = (got.float() - want.float()).abs()
        i = int(torch.nan_to_num(diff, nan=float("inf")).argmax())
        raise AssertionError(f"{what}: not bit-exact ({int((got.float() != want.float()).sum())} "
                             f"of {got.numel()} differ; e.g. got {got.flatten()[i].item()!r} "
                             f"want {want.flatten()[i].item()!r})")


def ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in fp32 ulps of want (values near 0 use the ulp of the smallest normal)."""
    w = want.double()
    ulp = torch.pow(2.0, torch.floor(torch.log2(w.abs().clamp_min(2.0 ** -126))) - 23)
    return ((got.double() - w).abs() / ulp).nan_to_num(0.0)


def bf16(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).to(torch.bfloat16)


# --- the table ---------------------------------------------------------------------------------
def test_every_symbol_is_exported_and_every_source_is_shipped(lib):
    for sym, spec in KERNELS.items():
        assert hasattr(lib.cdll, sym), f"{sym} not exported by {spec.source}"
        assert (host_build.kernel_dir() / spec.source).is_file()
        assert spec.golden, sym


def test_mmul_shapes_are_the_generations(lib):
    from torch_xdna.hw import AIE2P
    used = {s.symbol: s.mmul for s in KERNELS.values() if s.mmul}
    assert set(used) >= {"matmul_bf16_f32", "matmul_i8_i32", "matmul_bf16_bfp16_f32"}
    for sym, (dtype, shape) in used.items():
        assert tuple(AIE2P.mmul_shape.value[dtype]) == shape, sym


def test_tile_defines_from_ir_shapes():
    # the array IR declares buffers by shape; every layout of B gives the same defines
    assert KERNELS["matmul_bf16_f32"].tile_defines([(32, 64), (64, 16), (32, 16)]) == \
        {"DIM_M": 32, "DIM_K": 64, "DIM_N": 16}
    assert KERNELS["matmul_bf16_bfp16_f32"].tile_defines([(32, 64), (16, 72), (32, 16)]) == \
        {"DIM_M": 32, "DIM_K": 64, "DIM_N": 16}
    assert KERNELS["matmul_int4_bf16"].tile_defines([(32, 64), (640,), (64, 16), (32, 16), "i32",
                                                     "i32"]) == {"DIM_M": 32, "DIM_K": 64, "DIM_N": 16}
    assert KERNELS["store_silu_f32_bf16"].tile_defines([(32, 16), (32, 16)]) == \
        {"DIM_M": 32, "DIM_N": 16, "DIM_MC": 32}
    # a decode GEMV's C element holds the token's row only (kernels/lower/gemm.py stored_rows)
    assert KERNELS["store_none_f32_bf16"].tile_defines([(4, 8), (1, 8)]) == \
        {"DIM_M": 4, "DIM_N": 8, "DIM_MC": 1}
    assert KERNELS["attn_pv_bf16_f32"].tile_defines([(8, 16), (16, 32), (8, 32)]) == \
        {"ATT_TQ": 8, "ATT_TKV": 16, "ATT_D": 32}
    assert KERNELS["attn_finalize_f32"].tile_defines([(8, 32), (8,), (8, 32)]) == \
        {"ATT_TQ": 8, "ATT_D": 32}
    assert KERNELS["attn_qk_bf16_f32"].tile_defines([(8, 32), (16, 32), (8, 16)]) == \
        {"ATT_TQ": 8, "ATT_TKV": 16, "ATT_D": 32}
    assert KERNELS["attn_tile_bf16"].tile_defines(
        [(8, 32), (2, 16, 32), (8, 16), (8, 16), (8, 32), (8, 2), (2,)] + ["i32"] * 11) == \
        {"ATT_TQ": 8, "ATT_TKV": 16, "ATT_D": 32}
    assert KERNELS["attn_online_softmax_f32"].tile_defines([(8, 16), (8, 16), (8,), (8,), (8, 32)]) \
        == {"ATT_TQ": 8, "ATT_TKV": 16, "ATT_D": 32}
    assert KERNELS["softmax_bf16_f32"].tile_defines([(256,), (256,), (128,)]) == {}
    with pytest.raises(ValueError, match="2 buffer shapes for 3 pointer"):
        KERNELS["matmul_bf16_f32"].tile_defines([(32, 64), (64, 16)])


def _rst(symbol):
    return KERNELS[symbol].mmul[1]


def test_build_cache_is_private_and_reused(lib, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path))
    first = host_build.build(["zero.cc"], {"DIM_M": 4, "DIM_N": 4}, "-O0")
    assert (first.parent.stat().st_mode & 0o777) == 0o700
    mtime = first.stat().st_mtime_ns
    assert host_build.build(["zero.cc"], {"DIM_M": 4, "DIM_N": 4}, "-O0") == first
    assert first.stat().st_mtime_ns == mtime
    assert not list(first.parent.glob(".*"))             # no temporaries left behind
    other = host_build.build(["zero.cc"], {"DIM_M": 4, "DIM_N": 8}, "-O0")
    assert other != first


def test_unwritable_cache_is_a_clear_error(lib, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(blocker))
    with pytest.raises(host_build.HostBuildError, match="TORCH_XDNA_CACHE_DIR"):
        host_build.cache_dir()


def test_concurrent_builds_of_one_key_agree(lib, tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path))
    with ThreadPoolExecutor(2) as ex:
        paths = list(ex.map(lambda _: host_build.build(["zero.cc"], {"DIM_M": 8, "DIM_N": 8}, "-O0"), range(2)))
    assert len(set(paths)) == 1 and paths[0].is_file()
    assert sorted(p.name for p in paths[0].parent.iterdir()) == [paths[0].name]
    host_build.load(["zero.cc"], {"DIM_M": 8, "DIM_N": 8}, "-O0").zero_f32   # a whole, loadable library


def test_compile_error_names_the_source(lib, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path))
    with pytest.raises(host_build.HostBuildError, match="mm.cc"):
        host_build.build(["mm.cc"], {"DIM_M": 6})             # not a multiple of 2r: static_assert
    assert not [p for p in (tmp_path / "aie-host").iterdir()]


def test_bind_checks_dtypes(lib):
    with pytest.raises(TypeError, match="argument a must be a contiguous torch.bfloat16"):
        lib.mul_bf16_f32(torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4), 4)


# --- conversions -------------------------------------------------------------------------------
def test_cast_f32_bf16_rounds_to_nearest_even_and_flushes(lib):
    special = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 2 ** -127, -2 ** -130,
                            1e-38, 3.0e38, float("inf"), -float("inf"), 0.0, -0.0, 65504.0])
    x = torch.cat([special, torch.randn(1000) * 100, torch.randn(37) * 1e-37])
    out = torch.empty(x.numel(), dtype=torch.bfloat16)
    lib.cast_f32_bf16(x, out, x.numel())
    want = numerics.operand(x).to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert torch.equal(golden.cast_bf16(x).view(torch.int16), want.view(torch.int16))


# --- matmul ------------------------------------------------------------------------------------
def _dims(l):
    return l.defines["DIM_M"], l.defines["DIM_K"], l.defines["DIM_N"]


@pytest.mark.parametrize("which", ["main", "small"])
def test_matmul_bf16_f32_bit_exact(lib, small, which):
    l = lib if which == "main" else small
    m, k, n = _dims(l)
    a, b = bf16(m, k), bf16(k, n)
    c = torch.randn(m, n)                                  # accumulates into C in place
    want = golden.matmul_rowmajor(a, b, c)
    l.matmul_bf16_f32(a, b, c)
    assert_bits(c, want, "matmul_bf16_f32")


@pytest.mark.parametrize("which", ["main", "small"])
def test_matmul_i8_i32_exact(lib, small, which):
    l = lib if which == "main" else small
    m, k, n = _dims(l)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8)
    c0 = torch.randint(-1000, 1000, (m, n), dtype=torch.int32)
    c = c0.clone()
    l.matmul_i8_i32(a, b, c)
    assert torch.equal(c, golden.matmul_rowmajor(a, b, c0))
    assert torch.equal(c, c0 + a.int() @ b.int())


def _pad(x, rows, cols):
    out = torch.zeros(rows, cols, dtype=x.dtype)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _gemm_by_tiles(l, kind, a, b):
    """The array's use of the micro-kernel (kernels/lower/gemm.py): zero-padded edge tiles, per
    output tile zero C, one call per K block, then the store kernel; crop."""
    tm, tk, tn = _dims(l)
    m, k = a.shape
    n = b.shape[1]
    pm, pk, pn = -(-m // tm) * tm, -(-k // tk) * tk, -(-n // tn) * tn
    ap, bp = _pad(a, pm, pk), _pad(b, pk, pn)
    acc_dtype = torch.int32 if kind == "i8" else torch.float32
    out = torch.empty(pm, pn, dtype=acc_dtype)
    for i in range(0, pm, tm):
        for j in range(0, pn, tn):
            acc = torch.empty(tm, tn, dtype=acc_dtype)
            (l.zero_i32 if kind == "i8" else l.zero_f32)(acc)
            for p in range(0, pk, tk):
                at, bt = ap[i:i + tm, p:p + tk].contiguous(), bp[p:p + tk, j:j + tn].contiguous()
                if kind == "bfp16":
                    l.matmul_bf16_bfp16_f32(at, golden.bfp16_weight(bt), acc)
                else:
                    (l.matmul_i8_i32 if kind == "i8" else l.matmul_bf16_f32)(at, bt, acc)
            c = torch.empty(tm, tn, dtype=acc_dtype)
            (l.store_none_i32_i32 if kind == "i8" else l.store_none_f32_f32)(acc, c, 1.0)
            out[i:i + tm, j:j + tn] = c
    return out[:m, :n]


def _fp32_sum_bound(a, b):
    """Worst-case fp32 error of summing k exact products in any order: k * 2^-24 * |a| @ |b|."""
    return a.shape[-1] * 2.0 ** -24 * (a.abs().double() @ b.abs().double()) + 1e-30


@pytest.mark.parametrize("m,k,n", [(37, 70, 45), (1, 64, 32), (32, 128, 64)])
def test_gemm_edge_tiles_bf16_against_gemm_reference(lib, m, k, n):
    a, b = bf16(m, k), bf16(k, n)
    got = _gemm_by_tiles(lib, "bf16", a, b)
    assert_bits(got, golden.matmul_rowmajor(a, b, torch.zeros(m, n)), "bf16 GEMM by tiles")
    ref = torch.empty(m, n)
    GemmDesign(m, k, n, dtype="bf16").reference([a.float(), b.float()], [ref])
    assert bool(((got.double() - ref.double()).abs() <= _fp32_sum_bound(a.float(), b.float())).all())


@pytest.mark.parametrize("m,k,n", [(37, 70, 45), (8, 64, 32)])
def test_gemm_edge_tiles_int8_equals_gemm_reference(lib, m, k, n):
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8)
    got = _gemm_by_tiles(lib, "i8", a, b)
    ref = torch.empty(m, n, dtype=torch.int32)
    GemmDesign(m, k, n, dtype="int8", out_dtype=torch.int32).reference([a, b], [ref])
    assert torch.equal(got, ref)


@pytest.mark.parametrize("which", ["main", "small"])
def test_matmul_bfp16_bit_exact(lib, small, which):
    l = lib if which == "main" else small
    m, k, n = _dims(l)
    a, b = bf16(m, k), bf16(k, n)
    a[0, :8] = torch.tensor([1e-3, -1e-30, 0.0, -0.0, 5.0, -7.0, 1e-12, -2.0], dtype=torch.bfloat16)
    c = torch.randn(m, n)
    want = golden.matmul_bfp16(a, b, c)
    l.matmul_bf16_bfp16_f32(a, golden.bfp16_weight(b), c)
    assert_bits(c, want, "matmul_bf16_bfp16_f32")


@pytest.mark.parametrize("m,k,n", [(37, 70, 45), (16, 64, 32)])
def test_gemm_edge_tiles_bfp16_against_gemm_reference(lib, m, k, n):
    a, b = bf16(m, k), bf16(k, n)
    got = _gemm_by_tiles(lib, "bfp16", a, b)
    ref = torch.empty(m, n)
    GemmDesign(m, k, n, dtype="bfp16").reference([a.float(), b.float()], [ref])
    aq, bq = quant.quantize_bfp16(a.float(), -1), quant.quantize_bfp16(b.float(), -2)
    assert bool(((got.double() - ref.double()).abs() <= _fp32_sum_bound(aq, bq)).all())
    assert_bits(got, golden.matmul_bfp16(a, b, torch.zeros(m, n)), "bfp16 GEMM by tiles")


# --- weight-only int8 / int4 ---------------------------------------------------------------------
def _quantize(w, bits, group):
    q, scales = quant.quantize_int8(w, group) if bits == 8 else quant.quantize_int4(w, group)
    return q, scales, (q if bits == 8 else quant.unpack_int4(q))


def _wq_tile(q, scales, bits, p, tk, group):
    """The P operand for the K block starting at p: W columns [p, p + tk) and their scales."""
    g = min(group, tk)
    wt = q[:, p // 2:(p + tk) // 2] if bits == 4 else q[:, p:p + tk]
    st = scales[:, p // group:p // group + max(1, tk // group)] if group >= tk else \
        scales[:, p // g:(p + tk) // g]
    return golden.wq_pack(wt, st), st.shape[1]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kind", ["matmul", "gemv"])
@pytest.mark.parametrize("which,group", [("main", 32), ("main", 128), ("wide", 64), ("wide", 256)])
def test_weight_only_tile_bit_exact(lib, wide, bits, kind, which, group):
    l = lib if which == "main" else wide
    m, k, n = _dims(l)
    kq = max(k, group)                                    # the weight's full K (>= one group)
    w = torch.randn(n, kq)
    q, scales, qvals = _quantize(w, bits, group)
    p, sg = _wq_tile(q, scales, bits, 0, k, group)
    a = bf16(m, k)
    acc = torch.randn(m, n)
    acc0 = acc.clone()
    wdq = torch.zeros(k, n, dtype=torch.bfloat16)
    getattr(l, f"{kind}_int{bits}_bf16")(a, p, wdq, acc, group, sg)
    qk, sk = qvals[:, :k], scales[:, :sg]
    want_w = golden.dequant_rowmajor(qk, sk, group)
    if kind == "matmul":
        assert torch.equal(wdq.view(torch.int16), want_w.view(torch.int16))
        assert_bits(acc, golden.matmul_rowmajor(a, want_w, acc0), f"{kind} int{bits}")
    else:
        assert_bits(acc, golden.gemv_q(a, qk, sk, group, acc0), f"{kind} int{bits}")


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", [37, 1])
def test_weight_only_gemm_by_tiles_against_gemm_reference(lib, bits, m):
    """M > 1 (matmul_int*_bf16) and M = 1 (gemv_int*_bf16) over K and N tiles, as the lowering
    runs them; GemmDesign's weight-only reference within the summation bound."""
    tm, tk, tn = _dims(lib)
    group = 32
    k, n = 2 * tk, 2 * tn
    a, w = bf16(m, k), torch.randn(n, k)
    q, scales, qvals = _quantize(w, bits, group)
    kind = "gemv" if m == 1 else "matmul"
    pm = -(-m // tm) * tm
    ap = _pad(a, pm, k)
    out = torch.empty(pm, n)
    for j in range(0, n, tn):
        qj = q[j:j + tn]
        for i in range(0, pm, tm):
            acc = torch.empty(tm, tn)
            lib.zero_f32(acc)
            for p0 in range(0, k, tk):
                pk, sg = _wq_tile(qj, scales[j:j + tn], bits, p0, tk, group)
                wdq = torch.empty(tk, tn, dtype=torch.bfloat16)
                getattr(lib, f"{kind}_int{bits}_bf16")(ap[i:i + tm, p0:p0 + tk].contiguous(), pk,
                                                       wdq, acc, group, sg)
            out[i:i + tm, j:j + tn] = acc
    got = out[:m]
    wq = numerics.bf16_round(quant.dequantize(qvals, scales, group))
    ref = torch.empty(m, n)
    GemmDesign(m, k, n, dtype=f"int{bits}", w_group=group).reference([a.float(), q, scales], [ref])
    assert bool(((got.double() - ref.double()).abs() <= _fp32_sum_bound(a.float(), wq.t())).all())
    if kind == "matmul":
        assert_bits(got, golden.matmul_seq(a.float(), wq.t(), torch.zeros(m, n)), "weight-only GEMM")


# --- the GEMM epilogue store ---------------------------------------------------------------------
@pytest.mark.parametrize("act", ["none", "relu", "gelu", "gelu_tanh", "silu", "tanh", "sigmoid"])
def test_store_kernels(lib, act):
    m, _, n = _dims(lib)
    acc = torch.randn(m, n) * 3
    for out_dtype, suffix in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        c = torch.empty(m, n, dtype=out_dtype)
        getattr(lib, f"store_{act}_f32_{suffix}")(acc, c, 0.75)
        want = golden.store(acc, 0.75, act, out_dtype)
        assert torch.equal(c.float().view(torch.int32), want.float().view(torch.int32)), (act, suffix)
    ref = torch.empty(m, n)
    from torch_xdna.kernels.activations import apply_epilogue
    numerics.store(apply_epilogue(act, acc * 0.75), ref)
    assert bool(((c.float() - ref).abs() <= 2.0 ** -7 * ref.abs() + 1e-6).all())   # bf16 out
    ci = torch.empty(m, n, dtype=torch.int32)
    ai = torch.randint(-2 ** 30, 2 ** 30, (m, n), dtype=torch.int32)
    lib.store_none_i32_i32(ai, ci, 1.0)
    assert torch.equal(ci, ai)


# --- elementwise -------------------------------------------------------------------------------
EXACT_BINARY = {"add": "add", "sub": "sub", "max": "maximum", "min": "minimum"}
SIZES = (1, 15, 16, 100, 257)


def _values(n, dtype):
    x = torch.randn(n) * 4
    x[: min(n, 6)] = torch.tensor([0.0, -0.0, 1e-3, -30.0, 12.0, 0.5])[: min(n, 6)]
    return x.to(dtype)


@pytest.mark.parametrize("n", SIZES)
def test_exact_fp32_ops_equal_vector_reference(lib, n):
    a, b = _values(n, torch.float32), torch.randn(n) * 3
    for op, vop in EXACT_BINARY.items():
        out = torch.empty(n)
        getattr(lib, f"{op}_f32")(a, b, out, n)
        ref = torch.empty(n)
        VectorDesign(vop, ((n,), (n,)), (torch.float32,) * 2, (n,), torch.float32).reference([a, b], [ref])
        assert_bits(out, ref, op)
        assert_bits(out, golden.eltwise(op, a, b), op)
    for op in ("neg", "relu", "abs"):
        out = torch.empty(n)
        getattr(lib, f"{op}_f32")(a, out, n)
        ref = torch.empty(n)
        VectorDesign(op, ((n,),), (torch.float32,), (n,), torch.float32).reference([a], [ref])
        assert_bits(out, ref, op)


@pytest.mark.parametrize("n", SIZES)
def test_mul_and_square_bf16_equal_vector_reference(lib, n):
    a, b = _values(n, torch.bfloat16), bf16(n, scale=3)
    out = torch.empty(n)
    lib.mul_bf16_f32(a, b, out, n)
    ref = torch.empty(n)
    VectorDesign("mul", ((n,), (n,)), (torch.float32,) * 2, (n,), torch.float32).reference(
        [a.float(), b.float()], [ref])
    assert_bits(out, ref, "mul")
    lib.square_bf16_f32(a, out, n)
    VectorDesign("square", ((n,),), (torch.float32,), (n,), torch.float32).reference([a.float()], [ref])
    assert_bits(out, ref, "square")


def test_div_sqrt_reciprocal(lib):
    n = 1000
    a, b = bf16(n, scale=5), bf16(n, scale=5)
    pos = b.abs() + torch.tensor(0.01).to(torch.bfloat16)
    for op, vop, xs, max_ulps in (("div", "div", (a, b), 2), ("reciprocal", "reciprocal", (b,), 1),
                                  ("sqrt", "sqrt", (pos,), 1), ("rsqrt", "rsqrt", (pos,), 2)):
        out = torch.empty(n)
        getattr(lib, f"{op}_bf16_f32")(*xs, out, n)
        assert_bits(out, golden.eltwise(op, *xs), op)
        ref = torch.empty(n)
        VectorDesign(vop, tuple((n,) for _ in xs), (torch.float32,) * len(xs), (n,),
                     torch.float32).reference([x.float() for x in xs], [ref])
        assert float(ulps(out, ref).max()) <= max_ulps, op


# op -> (vector.OPS name, max ulps vs the reference, absolute slack): the kernel's own
# polynomial/rational approximations against torch's functions on the same bf16 operands.
TRANSCENDENTAL = {"exp": ("exp", 2, 0.0), "sigmoid": ("sigmoid", 3, 0.0),
                  "silu": ("silu", 4, 2.0 ** -30), "tanh": ("tanh", 3, 2.0 ** -26),
                  "gelu_tanh": ("gelu_tanh", 8, 2.0 ** -22),
                  "gelu": ("gelu", 4, 1e-6)}


@pytest.mark.parametrize("op", sorted(TRANSCENDENTAL))
def test_transcendental_elementwise(lib, op):
    vop, max_ulps, slack = TRANSCENDENTAL[op]
    x = torch.cat([torch.linspace(-20, 20, 4001), torch.randn(500) * 3,
                   torch.tensor([0.0, -0.0, 1e-20, -1e-20, 0.6249, 0.626, 88.0, -87.0])])
    if op == "exp":
        x = torch.cat([x, torch.tensor([88.7, 100.0, -87.3, -200.0, float("inf"), -float("inf")])])
    xb = x.to(torch.bfloat16)
    n = xb.numel()
    for size in (13, n):                           # a partial-vector tail, then all
        out = torch.empty(size)
        getattr(lib, f"{op}_bf16_f32")(xb[:size].contiguous(), out, size)
        assert_bits(out, golden.eltwise(op, xb[:size]), op)
    ref = torch.empty(n)
    VectorDesign(vop, ((n,),), (torch.float32,), (n,), torch.float32).reference([xb.float()], [ref])
    finite = torch.isfinite(ref)
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out[~finite], ref[~finite])
    err = ulps(out[finite], ref[finite])
    o, r = out[finite], ref[finite]
    flushed = (o == 0) & (r.abs() < numerics.FP32_MIN_NORMAL)      # below the normal range: FTZ
    ok = (err <= max_ulps) | ((o - r).abs() <= slack) | flushed
    assert bool(ok.all()), f"{op}: {int((~ok).sum())} values beyond {max_ulps} ulps (max {err.max():.1f})"


@pytest.mark.parametrize("op", ["neg", "relu", "abs", "exp", "silu", "gelu", "rsqrt", "square"])
def test_ir_unit_kernels(lib, op):
    from torch_xdna.kernels.aie import UNIT_OPS_EXACT
    exact = op in UNIT_OPS_EXACT
    x = torch.randn(77) * 3
    if op == "rsqrt":
        x = x.abs() + 0.01
    for tin, tout in ((torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                      (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)):
        xi = x.to(tin)
        out = torch.empty(77, dtype=tout)
        name = {torch.float32: "f32", torch.bfloat16: "bf16"}
        getattr(lib, f"{op}_{name[tin]}_{name[tout]}")(xi, out, 77)
        want = golden.unit(op, xi, tout, exact)
        assert torch.equal(out.float().view(torch.int32), want.float().view(torch.int32)), (op, tin, tout)
        if exact:                                     # and the project's reference, bit for bit
            ref = torch.empty(77, dtype=tout)
            VectorDesign(op, ((77,),), (tin,), (77,), tout).reference([xi], [ref])
            assert torch.equal(out.float(), ref.float()), (op, tin, tout)


def test_silu_mul(lib):
    n = 300
    g, u = bf16(n, scale=4), bf16(n, scale=2)
    out = torch.empty(n)
    lib.silu_mul_bf16_f32(g, u, out, n)
    assert_bits(out, golden.silu_mul(g, u), "silu_mul")
    ref = torch.nn.functional.silu(g.float()) * u.float()
    assert bool((ulps(out, ref) <= 5).all() | ((out - ref).abs() <= 2.0 ** -28).all())


def test_gelu_tanh_mul(lib):
    """The GeGLU gate (Gemma's MLP): bit-exact with its golden (the polynomial tanh of
    xdna_vec.h) and within a few ulps of torch's gelu(tanh) * up."""
    n = 300
    g, u = bf16(n, scale=4), bf16(n, scale=2)
    out = torch.empty(n)
    lib.gelu_tanh_mul_bf16_f32(g, u, out, n)
    assert_bits(out, golden.gelu_tanh_mul(g, u), "gelu_tanh_mul")
    ref = torch.nn.functional.gelu(g.float(), approximate="tanh") * u.float()
    assert float((out - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


# --- row kernels -------------------------------------------------------------------------------
ROWS = [(3, 8), (2, 50), (4, 64), (2, 384)]


def _vector_ref(op, x, params, extra=()):
    rows, n = x.shape
    shapes = ((rows, n),) + tuple(tuple(e.shape) for e in extra)
    out = torch.empty(rows, n)
    VectorDesign(op, shapes, (torch.float32,) * len(shapes), (rows, n), torch.float32,
                 tuple(sorted(params.items()))).reference([x.float(), *[e.float() for e in extra]], [out])
    return out


@pytest.mark.parametrize("rows,n", ROWS)
def test_softmax(lib, rows, n):
    x = bf16(rows, n, scale=3)
    x[0, 0] = 40.0
    out = torch.empty(rows, n)
    lib.softmax_bf16_f32(x, out, torch.empty(n), rows, n)
    assert_bits(out, golden.softmax(x), "softmax")
    ref = _vector_ref("softmax", x, {"dim": -1})
    assert float(ulps(out, ref).max()) <= 8
    assert torch.allclose(out.sum(-1), torch.ones(rows), atol=1e-5)


@pytest.mark.parametrize("rows,n", ROWS)
def test_layer_norm(lib, rows, n):
    x, w, b = bf16(rows, n, scale=2) + 3, bf16(n), bf16(n)
    out = torch.empty(rows, n)
    lib.layer_norm_bf16_f32(x.contiguous(), torch.cat([w, b]), out, torch.empty(n), rows, n, 1e-5)
    assert_bits(out, golden.layer_norm(x, w, b, 1e-5), "layer_norm")
    ref = _vector_ref("layer_norm", x, {"eps": 1e-5, "has_weight": True, "has_bias": True,
                                        "norm_dims": 1}, (w, b))
    # the mean/variance sums differ in order: bounded by n * 2^-24 relative on each statistic
    assert float((out - ref).abs().max()) <= 64 * n * 2.0 ** -24 * float(ref.abs().max() + 1)


@pytest.mark.parametrize("rows,n", ROWS)
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm(lib, rows, n, offset):
    x, w = bf16(rows, n, scale=2), bf16(n)
    out = torch.empty(rows, n)
    lib.rms_norm_bf16_f32(x, w, out, torch.empty(n), rows, n, 1e-6, offset)
    assert_bits(out, golden.rms_norm(x, w, 1e-6, offset), "rms_norm")
    ref = _vector_ref("rms_norm", x, {"eps": 1e-6, "has_weight": True, "weight_offset": offset}, (w,))
    assert float(ulps(out, ref).max()) <= 8


@pytest.mark.parametrize("rows,d", [(4, 64), (3, 128), (2, 24)])
def test_rope_equals_llm_blocks(lib, rows, d):
    x = bf16(rows, d)
    pos = torch.tensor(1234.0)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    ang = torch.cat([pos * inv_freq, pos * inv_freq])
    cos = ang.cos().to(torch.bfloat16)
    ssin = ang.sin().to(torch.bfloat16)
    ssin[: d // 2] = -ssin[: d // 2]
    out = torch.empty(rows, d)
    lib.rope_bf16_f32(x, cos, ssin, out, rows, d)
    assert_bits(out, golden.rope(x, cos, ssin), "rope")
    assert_bits(out, _rope(x.float(), cos.float(), ssin.float()), "rope vs llm_blocks._rope")


@pytest.mark.parametrize("rows,d", [(6, 64), (3, 128), (2, 24)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_qk_norm_rope(lib, rows, d, offset):
    """The fused layer's q/k stage: per-head RMSNorm (own weight row per head) then RoPE, both
    rounded to bf16; bit-exact with its golden, and within the rms_norm bound of the layer's
    reference functions (llm_layer_stages.qk_norm_rope_rows)."""
    from torch_xdna.kernels.stages.llm_layer import qk_norm_rope_rows
    x, w = bf16(rows, d, scale=2), bf16(rows, d)
    ang = torch.tensor(77.0) * (1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))).repeat(2)
    cos, ssin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    ssin[: d // 2] = -ssin[: d // 2]
    xcs = torch.cat([x.reshape(-1), cos, ssin])
    out = torch.empty(rows, d, dtype=torch.bfloat16)
    lib.qk_norm_rope_bf16(xcs, w, out, torch.empty(2 * d), rows, d, 1e-6, offset)
    assert_bits(out, golden.qk_norm_rope(xcs, w, rows, d, 1e-6, offset), "qk_norm_rope")
    ref = qk_norm_rope_rows(x.float(), w.float(), cos.float(), ssin.float(), 1e-6, offset)
    assert (out.float() - ref).abs().max() <= 2 ** -6 * ref.abs().max()    # a bf16 ulp or two


@pytest.mark.parametrize("rows,d", [(6, 64), (3, 128), (2, 24)])
def test_qk_rope(lib, rows, d):
    """The q/k stage of layers without q/k norm (Llama): RoPE on the bf16 heads, rounded to
    bf16; bit-exact with its golden and with the layer's reference (llm_stages.qk_rope_rows)."""
    from torch_xdna.kernels.stages.llm_layer import qk_rope_rows
    x = bf16(rows, d, scale=2)
    ang = torch.tensor(77.0) * (1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))).repeat(2)
    cos, ssin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    ssin[: d // 2] = -ssin[: d // 2]
    xcs = torch.cat([x.reshape(-1), cos, ssin])
    out = torch.empty(rows, d, dtype=torch.bfloat16)
    lib.qk_rope_bf16(xcs, out, rows, d)
    assert_bits(out, golden.qk_rope(xcs, rows, d), "qk_rope")
    ref = qk_rope_rows(x.float(), cos.float().unsqueeze(0), ssin.float().unsqueeze(0))
    assert_bits(out, ref.to(torch.bfloat16), "qk_rope vs llm_stages.qk_rope_rows")


# --- attention ---------------------------------------------------------------------------------
def _attention_by_tiles(l, q, k, v, scale, causal, q_offset, window=0, softcap=0.0):
    tq, tkv, d = l.defines["ATT_TQ"], l.defines["ATT_TKV"], l.defines["ATT_D"]
    lq, s_len = q.shape[0], k.shape[0]
    pq, pk = -(-lq // tq) * tq, -(-s_len // tkv) * tkv
    qp = torch.zeros(pq, d, dtype=torch.bfloat16)
    qp[:lq] = q
    kp = torch.zeros(pk, d, dtype=torch.bfloat16)
    kp[:s_len] = k
    vp = torch.zeros(pk, d, dtype=torch.bfloat16)
    vp[:s_len] = v
    out = torch.empty(pq, d)
    for q0 in range(0, pq, tq):
        m = torch.full((tq,), float("-inf"))
        lsum, o = torch.zeros(tq), torch.zeros(tq, d)
        for k0 in range(0, pk, tkv):
            s = torch.empty(tq, tkv)
            p = torch.empty(tq, tkv, dtype=torch.bfloat16)
            l.attn_qk_bf16_f32(qp[q0:q0 + tq].contiguous(), kp[k0:k0 + tkv].contiguous(), s, scale,
                               q_offset + q0, k0, s_len, int(causal), window, softcap)
            l.attn_online_softmax_f32(s, p, m, lsum, o)
            l.attn_pv_bf16_f32(p, vp[k0:k0 + tkv].contiguous(), o)
        res = torch.empty(tq, d)
        l.attn_finalize_f32(o, lsum, res)
        out[q0:q0 + tq] = res
    return out[:lq]


@pytest.mark.parametrize("lq,s_len,causal,window,softcap",
                         [(5, 40, True, 0, 0.0), (8, 16, False, 0, 0.0), (13, 37, False, 0, 0.0),
                          (1, 33, True, 0, 0.0), (9, 40, True, 12, 0.0), (6, 30, True, 0, 2.0)])
def test_attention_blocks(lib, lq, s_len, causal, window, softcap):
    d = lib.defines["ATT_D"]
    q, k, v = bf16(lq, d, scale=2), bf16(s_len, d, scale=2), bf16(s_len, d)
    scale = 1 / math.sqrt(d)
    q_offset = s_len - lq
    got = _attention_by_tiles(lib, q, k, v, scale, causal, q_offset, window, softcap)
    want = golden.attention_flash(q, k, v, scale=scale, tq=lib.defines["ATT_TQ"],
                                  tkv=lib.defines["ATT_TKV"], causal=causal, q_offset=q_offset,
                                  window=window, softcap=softcap)
    assert_bits(got, want, "attention blocks")
    ref = attention_reference(q.reshape(1, 1, lq, d), k.reshape(1, 1, s_len, d),
                              v.reshape(1, 1, s_len, d), scale=scale, causal=causal,
                              q_offset=q_offset, window=window or None,
                              softcap=softcap or None)[0, 0]
    # P is rounded to bf16 before (flash) vs after (reference) normalisation: 2^-8 relative
    # on each weight, so |diff| <= 2^-8 * max|v| per output
    assert float((got - ref).abs().max()) <= 2.0 ** -8 * float(v.float().abs().max())


@pytest.mark.parametrize("group,tq,lq,s_len,causal,window,softcap",
                         [(2, 4, 4, 40, True, 0, 0.0), (1, 8, 8, 33, False, 0, 0.0),
                          (4, 2, 2, 48, True, 16, 0.0), (2, 4, 4, 32, True, 0, 3.0)])
def test_ir_attention_work_item(lib, group, tq, lq, s_len, causal, window, softcap):
    """attn_init / attn_q / attn_tile per key tile / attn_finish on one GQA work item (a KV head,
    `group` query heads of tq rows), as kernels/lower/attention.py drives them."""
    rows, tkv, d = lib.defines["ATT_TQ"], lib.defines["ATT_TKV"], lib.defines["ATT_D"]
    assert group * tq == rows
    q = bf16(group, lq, d, scale=2)
    k, v = bf16(s_len, d, scale=2), bf16(s_len, d)
    q_offset = s_len - lq
    scale = 1 / math.sqrt(d)
    pk = -(-s_len // tkv) * tkv
    kp, vp = torch.zeros(pk, d, dtype=torch.bfloat16), torch.zeros(pk, d, dtype=torch.bfloat16)
    kp[:s_len], vp[:s_len] = k, v
    q_rows = q.reshape(rows, d).contiguous()
    o, ml = torch.empty(rows, d), torch.empty(rows, 2)
    state = torch.tensor([5, 0], dtype=torch.int32)
    qbuf, s, p = (torch.empty(rows, d, dtype=torch.bfloat16), torch.empty(rows, tkv),
                  torch.empty(rows, tkv, dtype=torch.bfloat16))
    lib.attn_init_f32(o, ml, state)
    first = torch.zeros(2, tkv, d, dtype=torch.bfloat16)
    first.view(-1)[:rows * d] = q_rows.view(-1)
    lib.attn_q_bf16(first, qbuf, state)
    assert torch.equal(qbuf, q_rows)
    for j in range(pk // tkv):
        kv = torch.stack([kp[j * tkv:(j + 1) * tkv], vp[j * tkv:(j + 1) * tkv]]).contiguous()
        lib.attn_tile_bf16(qbuf, kv, s, p, o, ml, state, s_len, q_offset, scale, 0, 1, 1, tq,
                           group, int(causal), window, softcap)
    lib.attn_finish_f32(o, ml, state)
    assert state.tolist() == [pk // tkv, 1]
    want = golden.attention_item(q_rows, kp, vp, kv_len=s_len, q_offset=q_offset, t0=0, tq=tq,
                                 scale=scale, tkv=tkv, causal=causal, window=window, softcap=softcap)
    assert_bits(o, want, "IR attention work item")
    ref = attention_reference(q.reshape(1, group, lq, d), k.reshape(1, 1, s_len, d),
                              v.reshape(1, 1, s_len, d), scale=scale, causal=causal,
                              q_offset=q_offset, window=window or None, softcap=softcap or None)[0]
    assert float((o.reshape(group, lq, d) - ref).abs().max()) <= 2.0 ** -8 * float(v.float().abs().max())


def test_ir_attention_tile_ignores_stale_rows_past_kv_len(lib):
    """A key tile read whole from a resident cache: rows at or past kv_len hold stale values
    (huge keys, NaN / inf values); attn_tile masks them and reads their V rows as zero, so the
    result is bit-identical to the zero-padded tile and to the golden."""
    rows, tkv, d = lib.defines["ATT_TQ"], lib.defines["ATT_TKV"], lib.defines["ATT_D"]
    kv_len = tkv + 5
    q_rows = bf16(rows, d, scale=2)
    k, v = bf16(2 * tkv, d, scale=2), bf16(2 * tkv, d)
    stale_k, stale_v = k.clone(), v.clone()
    stale_k[kv_len:], stale_v[kv_len:] = 1e4, float("nan")
    stale_v[-1] = float("inf")
    k[kv_len:], v[kv_len:] = 0, 0
    outs = []
    for kk, vv in ((k, v), (stale_k, stale_v)):
        o, ml = torch.empty(rows, d), torch.empty(rows, 2)
        state = torch.tensor([0, 0], dtype=torch.int32)
        s, p = torch.empty(rows, tkv), torch.empty(rows, tkv, dtype=torch.bfloat16)
        lib.attn_init_f32(o, ml, state)
        for j in range(2):
            kv = torch.stack([kk[j * tkv:(j + 1) * tkv], vv[j * tkv:(j + 1) * tkv]]).contiguous()
            lib.attn_tile_bf16(q_rows, kv, s, p, o, ml, state, kv_len, kv_len - 1, 0.125, 0, 1, 1,
                               rows, 1, 1, 0, 0.0)
        lib.attn_finish_f32(o, ml, state)
        outs.append(o)
    assert torch.isfinite(outs[1]).all()
    assert_bits(outs[1], outs[0], "stale rows past kv_len")
    want = golden.attention_item(q_rows, stale_k, stale_v, kv_len=kv_len, q_offset=kv_len - 1,
                                 t0=0, tq=rows, scale=0.125, tkv=tkv, causal=True)
    assert_bits(outs[1], want, "golden with stale rows")


def test_attention_fully_masked_row_gives_zero(lib):
    d, tq, tkv = lib.defines["ATT_D"], lib.defines["ATT_TQ"], lib.defines["ATT_TKV"]
    q, k = bf16(tq, d), bf16(tkv, d)
    s = torch.empty(tq, tkv)
    lib.attn_qk_bf16_f32(q, k, s, 0.125, 0, 0, 0, 0, 0, 0.0)   # kv_valid = 0: all keys masked
    assert bool(torch.isneginf(s).all())
    m, lsum, o = torch.full((tq,), float("-inf")), torch.zeros(tq), torch.zeros(tq, d)
    p = torch.empty(tq, tkv, dtype=torch.bfloat16)
    lib.attn_online_softmax_f32(s, p, m, lsum, o)
    out = torch.empty(tq, d)
    lib.attn_finalize_f32(o, lsum, out)
    assert bool((out == 0).all()) and bool((p.float() == 0).all())


# --- the emulation itself ------------------------------------------------------------------------
@pytest.fixture(scope="session")
def probe(lib):
    import ctypes
    from pathlib import Path
    cdll = ctypes.CDLL(str(host_build.build([Path(__file__).with_name("aie_emu_probe.cc")])))
    cdll.probe_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    cdll.probe_bfp16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return cdll


def test_emulated_rounding_register(probe):
    assert probe.probe_reset_mode() == 0                   # floor: the core's reset mode
    x = torch.cat([torch.randn(4000) * 50, torch.tensor([1 + 2 ** -8, -(1 + 2 ** -8), -1e-39, 2 ** -127,
                                                          -(1 + 3 * 2 ** -9), 1.0, -1.0, 0.0])])
    x = torch.cat([x, torch.zeros((-x.numel()) % 16)])
    for mode, name in ((0, numerics.ROUND_TOWARD_NEG_INF), (6, numerics.ROUND_NEAREST_EVEN)):
        out = torch.empty(x.numel(), dtype=torch.int16)
        probe.probe_bf16(x.data_ptr(), out.data_ptr(), x.numel(), mode)
        want = numerics.operand(x, rounding=name).to(torch.bfloat16).view(torch.int16)
        assert torch.equal(out, want), name


def test_emulated_bfp16_conversion_equals_quant_encoding(probe):
    x = torch.randn(16, 64) * torch.logspace(-6, 6, 16).unsqueeze(1)
    x[0, :8] = torch.tensor([1.0, -1e-12, 0.0, -0.0, 3.0, -1e-30, 127.0, -128.5])
    x[1, :8] = torch.tensor([-1e-39, 1e-39, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # subnormals flush
    out = torch.empty(16 * 72, dtype=torch.uint8)
    probe.probe_bfp16(x.contiguous().data_ptr(), out.data_ptr(), 16)
    assert torch.equal(out, quant.encode_bfp16(x.reshape(-1, 8)).reshape(-1))


def test_misaligned_vector_access_stops_the_emulation(lib):
    """load_v/store_v on a pointer not aligned to the vector is a kernel bug: the emulation stops
    (in a child process: it aborts) and names the access."""
    import subprocess
    import sys
    so = host_build.build(["zero.cc"], {"DIM_M": 4, "DIM_N": 4}, "-O0")
    code = ("import ctypes; lib = ctypes.CDLL(%r); buf = ctypes.create_string_buffer(256); "
            "base = (ctypes.addressof(buf) + 63) // 64 * 64; lib.zero_f32(ctypes.c_void_p(base)); "
            "print('aligned ok', flush=True); lib.zero_f32(ctypes.c_void_p(base + 4))" % str(so))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "aligned ok" in res.stdout
    assert res.returncode != 0 and "store_v of 64 bytes" in res.stderr and "not 64-byte aligned" in res.stderr


def test_docs_list_every_kernel():
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[1] / "docs" / "kernels.md").read_text()
    missing = [s for s in KERNELS if f"`{s}`" not in doc]
    assert not missing, f"docs/kernels.md does not list {missing}"


# --- fp32 multiplies on AIE2P: which model each kernel assumes ------------------------------------
def test_every_kernel_states_its_fp32_multiply_model():
    """Each KernelSpec says how its fp32 x fp32 multiplies run: "none" (bf16 x bf16 -> fp32
    products, exact, or integers) or aie_api's FP32 emulation. A source that calls xdna::fmul
    (or aie::mul on float vectors) has emulated symbols; matmuls and the bf16-operand mul /
    square (restructured to bf16 x bf16, xdna_vec.h bmul) have none."""
    from pathlib import Path

    from torch_xdna.kernels import aie as aie_pkg
    from torch_xdna.kernels.aie import FP32_MUL_MODELS
    root = Path(aie_pkg.__file__).parent / "aie2p"
    for spec in KERNELS.values():
        assert spec.fp32_mul in FP32_MUL_MODELS, spec.symbol
        text = (root / spec.source).read_text()
        if spec.fp32_mul == "none" and spec.source not in ("eltwise.cc", "binary.cc", "store.cc",
                                                            "embed.cc"):
            assert "fmul(" not in text, spec.symbol
    expect = {"matmul_bf16_f32": "none", "matmul_int4_bf16": "none", "mul_bf16_f32": "none",
              "square_bf16_f32": "none", "mul_bf16_bf16": "none", "add_f32_f32": "none",
              "gate_mul_f32_f32": "bf16x3 emulation", "exp_bf16_f32": "bf16x3 emulation",
              "div_bf16_f32": "bf16x3 emulation", "softmax_bf16_f32": "bf16x3 emulation",
              "rms_norm_bf16_bf16": "bf16x3 emulation", "store_none_f32_f32": "bf16x3 emulation",
              "attn_tile_bf16": "bf16x3 emulation", "store_none_i32_i32": "none",
              "embed_fp32_f32": "bf16x3 emulation", "embed_int4_f32": "none"}
    assert {s: KERNELS[s].fp32_mul for s in expect} == expect


def test_host_emulation_computes_the_fp32_multiply_emulation(lib):
    """gate_mul multiplies two fp32 accumulators: the host build computes aie_api's FP32
    emulation (golden.fmul, bit for bit), which is not the IEEE product on every lane; the
    bf16-operand mul is the exact product."""
    n = 4096
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    out = torch.empty(n)
    lib.gate_mul_f32_f32(a, b, out, n)
    assert_bits(out, golden.fmul(a, b), "gate_mul (FP32 emulation)")
    assert not bits_equal(out, a * b), "the emulation equals IEEE on every lane: not modelled?"
    assert (out - a * b).abs().max() <= (a * b).abs().max() * 2.0 ** -22
    x, y = a.to(torch.bfloat16), b.to(torch.bfloat16)
    lib.mul_bf16_f32(x, y, out, n)
    assert_bits(out, x.float() * y.float(), "mul (bf16 x bf16, exact)")


# --- token embedding rows (embed.cc) ---------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("scale", [1.0, 33.941125])          # Gemma's sqrt(hidden) for 1152
def test_embed_rows_equal_golden_and_embed_design(precision, scale):
    """embed_<precision>_f32 on gathered rows: bit-exact with golden.embed_row, and with
    EmbedDesign.reference (the functional level) where its multiply is exact (every precision
    but fp32 with a scale, whose multiply is aie_api's FP32 emulation on the chip)."""
    from torch_xdna.kernels.blocks.llm import EmbedDesign
    from torch_xdna.kernels.blocks.weights import weight_tensors
    h, g, vocab, rows = 128, 32, 40, 5
    lib = Lib(["embed.cc"], {"EMB_H": h})
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(vocab, h, generator=gen)
    if precision in ("int8", "int4"):
        q, s = quant.quantize_int8(w, g) if precision == "int8" else quant.quantize_int4(w, g)
        tables = [q, s.to(torch.bfloat16)]
    else:
        tables = [w.to(torch.bfloat16) if precision == "bf16" else w]
    ids = torch.tensor([3, 0, 39, 3, 17], dtype=torch.int32)
    d = EmbedDesign(vocab, h, rows, precision, g, scale)
    want = torch.zeros(rows, h)
    d.reference(tables + [ids], [want])
    fn = getattr(lib, f"embed_{precision}_f32")
    for r, i in enumerate(ids.tolist()):
        parts = [t[i] for t in tables]
        if len(parts) > 1 or precision == "bf16":      # the fifo element: bytes of values, scales
            row = torch.cat([p.contiguous().view(torch.uint8).reshape(-1) for p in parts])
        else:
            row = parts[0].contiguous()
        out = torch.empty(h)
        fn(row, out, g, scale)
        assert_bits(out, golden.embed_row(parts, precision, g, scale), f"embed {precision} row {r}")
        if precision != "fp32" or scale == 1.0:
            assert_bits(out, want[r], f"embed {precision} row {r} vs EmbedDesign.reference")
    assert weight_tensors(precision) == len(tables)


@pytest.mark.parametrize("sym", ["store_silu_f32_bf16", "store_none_f32_f32", "store_none_i32_i32"])
def test_store_first_rows_only(sym):
    """DIM_MC < DIM_M: the kernel writes the tile's first DIM_MC rows (the rows every tile holds
    in a decode GEMV) and nothing past them."""
    lib = Lib(["store.cc"], {"DIM_M": 4, "DIM_N": 16, "DIM_MC": 1})
    gen = torch.Generator().manual_seed(5)
    i32 = sym.endswith("i32_i32")
    acc = torch.randint(-999, 999, (4, 16), dtype=torch.int32, generator=gen) if i32 else \
        torch.randn(4, 16, generator=gen)
    out_dt = torch.int32 if i32 else torch.bfloat16 if sym.endswith("bf16") else torch.float32
    c = torch.full((2, 16), 7, dtype=out_dt)          # one row more than the kernel may write
    getattr(lib, sym)(acc, c, 1.0)
    act = sym.split("_")[1]
    want = golden.store(acc[:1], 1.0, act, out_dt)
    assert torch.equal(c[:1].float(), want.float()), sym
    assert torch.equal(c[1:], torch.full((1, 16), 7, dtype=out_dt)), "wrote past DIM_MC rows"
