"""Array IR: every lowered design fits the generation and agrees with its plan's capacities."""
import pytest
import torch

from torch_xdna.array import ir
from torch_xdna.array.validate import ArrayIRError, usage, validate
from torch_xdna.hw import NPU4
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.ops.gemm_pack import pack_bfp16_tiles, pack_weight_tiles
from torch_xdna.kernels.ops.vector import EmbeddingDesign, VectorDesign
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.ops.dma import ConcatDesign, GatherDesign
from torch_xdna.kernels.ops.fused import ChainDesign
from torch_xdna.kernels import quant

F32, BF16 = torch.float32, torch.bfloat16
DESIGNS = [
    GemmDesign(64, 64, 64),
    GemmDesign(100, 70, 130),                                  # M, N, K edges
    GemmDesign(256, 256, 256, dtype="int8", out_dtype=torch.int32),
    GemmDesign(64, 128, 64, dtype="bfp16"),
    GemmDesign(1, 512, 1000, dtype="int4", w_group=32),        # GEMV, int4 weight groups, N edge
    GemmDesign(3, 256, 200, dtype="int8", w_group=128),
    GemmDesign(8, 64, 96, bias=True, residual=True, epilogue="gelu"),
    VectorDesign("add", ((1000,), (1000,)), (F32, F32), (1000,), F32),
    VectorDesign("silu", ((4096,),), (BF16,), (4096,), F32),
    VectorDesign("softmax", ((64, 500),), (BF16,), (64, 500), F32),
    VectorDesign("rms_norm", ((8, 1024), (1024,)), (F32, F32), (8, 1024), F32,
                 (("eps", 1e-6), ("has_weight", True))),
    VectorDesign("layer_norm", ((16, 768), (768,), (768,)), (F32,) * 3, (16, 768), F32,
                 (("eps", 1e-5), ("has_bias", True), ("has_weight", True), ("norm_dims", 1))),
    ChainDesign(((64, 96), (96,)), ("float32", "float32"),
                (("add", (("in", 0), ("in", 1)), ()), ("silu", (("s", 0),), ())), (1,), ("float32",)),
    AttentionDesign(1, 4, 2, 1, 256, 64, causal=True),                 # GQA decode
    AttentionDesign(1, 4, 4, 20, 20, 32, causal=True, top_left=True),  # prefill, edge q tile
    AttentionDesign(2, 4, 4, 16, 16, 32, mask=True, mask_shape=(2, 1, 1, 16)),   # padding mask
    AttentionDesign(1, 2, 2, 8, 8, 64, mask=True, mask_bool=True, mask_shape=(1, 1, 8, 8)),
    ConcatDesign(((4, 3, 5), (4, 2, 5), (4, 0, 5)), torch.float32, 1, (4, 5, 5)),
    GatherDesign("index_select", ((10, 6), (4,)), torch.bfloat16, (4, 6), (("dim", 0),)),
    EmbeddingDesign(100, 64, 5, torch.float32),
]
# launch-time values a lowering reads (gathers: the indices; attention: the valid KV length)
LAUNCH = {
    "concat": {},
    "gather": {"inputs": [torch.zeros(10, 6), torch.tensor([3, 1, 1, 7])]},
    "embedding": {"inputs": [torch.zeros(100, 64), torch.tensor([1, 2, 99, 0, 5])]},
}
# static buffers a plan does not count: attention's per-core state (2 x i32) and its three
# runtime-parameter slots (kv_len, q_offset, the key-tile trip count)
PLAN_UNCOUNTED_L1 = {"attention": 20}


def lowered(d):
    if d.kind == "attention":
        return lower(d, NPU4, kv_len=min(100, d.kv_len))
    return lower(d, NPU4, **LAUNCH.get(d.kind, {}))


@pytest.mark.parametrize("d", DESIGNS, ids=lambda d: d.name)
def test_ir_fits_and_agrees_with_plan(d):
    plan = d.plan(NPU4)
    progs = lowered(d)
    main = progs[0]
    u = validate(main, NPU4)
    cores = [t for t in main.tiles if t.kind == "compute"]
    if not plan.cores:                      # data movement: the mem tile's ping-pong buffer
        assert not cores and u.max_of("memory", "mem", main) <= plan.memtile_bytes
        assert u.max_of("bds", "mem", main) <= max(plan.memtile_bds, 4)
        return
    # the plan's L1 figure is exactly the IR's per-core buffers (fifo depth x element + static)
    extra = PLAN_UNCOUNTED_L1.get(d.kind, 0)
    l1 = max(u.memory[t.name] for t in cores)
    if d.kind == "chain":               # a chain's unit shrinks to tile a broadcast operand
        assert l1 <= plan.l1_bytes
    elif d.kind == "attention" and d.mask_bool:   # the plan counts a bool mask at 4 bytes
        assert l1 <= plan.l1_bytes + extra
    else:
        assert l1 == plan.l1_bytes + extra
    # what the plan proved available covers what the IR uses on every core
    assert max(u.bds[t.name] for t in cores) <= plan.core_bds
    assert max(u.locks[t.name] for t in cores) <= max(plan.core_locks, 2 * plan.core_bds)
    assert len(cores) == plan.cores
    assert len({t.col for t in cores}) == plan.columns
    # DMA channels: within the plan's per-core and per-shim figures where it states them (the
    # plan counts shim channels as (into the array, out of it): MM2S, S2MM)
    for key, kind in (("core_dma", "compute"), ("shim_dma", "shim")):
        if key in plan.notes:
            cin, cout = plan.notes[key]
            used = [u.channels[t.name] for t in main.tiles if t.kind == kind]
            if kind == "shim":
                used = [(o, i) for i, o in used]
            assert max(i for i, _ in used) <= cin and max(o for _, o in used) <= cout, key
    for p in progs[1:]:
        validate(p, NPU4)
    from torch_xdna.array import txn
    for p in progs:                      # every task fits the shim BD fields
        assert len(txn.encode_sequence(p)) > 0


def test_gemm_grid_and_tile_are_the_plans():
    d = GemmDesign(256, 512, 384)
    plan = d.plan(NPU4)
    prog = lower(d, NPU4)[0]
    tm, tk, tn = plan.tile
    mm = prog.kernel("matmul_bf16_f32")
    assert mm.arg_types[0].shape == (tm, tk) and mm.arg_types[1].shape == (tk, tn)
    assert mm.arg_types[2].shape == (tm, tn)
    # every byte of A, B is read, and C written, at least once; C exactly once
    u = usage(prog)
    c_bytes = 256 * 384 * 4
    assert u.bytes_out == c_bytes
    assert u.bytes_in >= (256 * 512 + 512 * 384) * 2


def test_weight_tiles_pack_exactly():
    d = GemmDesign(1, 256, 200, dtype="int4", w_group=32)
    w = torch.randn(200, 256)
    q, s = quant.quantize_int4(w, 32)
    packed = pack_weight_tiles(d, NPU4, q, s)
    prog = lower(d, NPU4)[0]
    arg = next(a for a in prog.sequence.args if a.name == "B")
    assert packed.dtype == torch.uint8 and packed.numel() == arg.type.numel
    tm, tk, tn = d.plan(NPU4).tile
    tile0 = packed[: tn * tk // 2 + tn * (tk // 32) * 2]
    assert torch.equal(tile0[: tk // 2], q[0, : tk // 2])          # row 0 of W tile (0, 0)


def test_validator_names_the_limit():
    d = GemmDesign(64, 64, 64)
    prog = lower(d, NPU4)[0]
    f = prog.fifos[0]
    big = ir.ObjectFifo(f.name, f.producer, f.consumers, 64, ir.TensorType((64, 1024), "bf16"))
    bad = ir.ArrayProgram(prog.name, prog.generation, prog.tiles,
                          (big,) + prog.fifos[1:], prog.links, prog.buffers, prog.kernels,
                          prog.cores, prog.sequence)
    with pytest.raises(ArrayIRError, match="mem tile memory"):
        validate(bad, NPU4)
    task = prog.sequence.tasks[0]
    import dataclasses
    oob = dataclasses.replace(task, offset=10 ** 9)
    seq = dataclasses.replace(prog.sequence, ops=(oob,) + prog.sequence.ops[1:])
    with pytest.raises(ArrayIRError, match="host buffer has"):
        validate(dataclasses.replace(prog, sequence=seq), NPU4)


def test_multi_stage_designs_lower_stage_by_stage():
    import dataclasses

    from torch_xdna.kernels.ops.fused import GatedGemmDesign
    from torch_xdna.kernels.blocks.llm import AttentionBlockDesign, DecoderLayerDesign, MlpBlockDesign
    gg = lower(GatedGemmDesign(4, 256, 128), NPU4)
    assert [dict(p.notes).get("stage") for p in gg] == ["gate_proj", "up_proj", "gate"]
    assert dict(gg[0].notes)["launch_args"] == ("A", "Wg", "Wu", "out")
    for p in gg:
        validate(p, NPU4)
    # biases (OPT-style blocks) have no executable stages: the structural ones
    a = dataclasses.replace(AttentionBlockDesign(256, 1, "int4", 32, 1e-6, 0.0, 4, 2, 64, 256),
                            bias=True)
    m = MlpBlockDesign(256, 1, "int4", 32, 1e-6, 0.0, 512)
    progs = lower(DecoderLayerDesign(a, m), NPU4)
    stages = [dict(p.notes)["stage"] for p in progs]
    assert stages[0] == "llm_attention.attn_norm" and stages[-1] == "llm_mlp.down"
    from torch_xdna.array import txn
    for p in progs:
        validate(p, NPU4)
        txn.encode_sequence(p)
        assert dict(p.notes)["executable"] is False
    # every stage's args are the block's operands or named scratch buffers
    assert {a.name for a in progs[1].sequence.args} == {"T_norm", "w_qkv", "T_qkv"}


SWEEP = [(m, k, n, dt, g) for (m, k, n) in ((1, 64, 8), (5, 72, 36), (17, 200, 44), (64, 136, 96),
                                            (130, 40, 260), (3, 1024, 1000))
         for dt, g in (("bf16", 0), ("int8", 0), ("int4", 8), ("int8", 8), ("bfp16", 0))]


def prog_columns(prog) -> int:
    return len({t.col for t in prog.tiles if t.kind == "compute"})


@pytest.mark.parametrize("m,k,n,dt,g", SWEEP)
def test_gemm_shape_sweep_fits_and_encodes(m, k, n, dt, g):
    """Edge tiles in M, N and K (K not a multiple of the K tile) for every GEMM dtype."""
    from torch_xdna.array import txn
    if dt == "bfp16" and k % 8:
        pytest.skip("bfp16 blocks need K % 8 == 0")
    d = GemmDesign(m, k, n, dtype=dt, w_group=g,
                   out_dtype=torch.int32 if dt == "int8" and not g else torch.float32)
    (prog,) = lower(d, NPU4)
    u = validate(prog, NPU4)
    cores = [t for t in prog.tiles if t.kind == "compute"]
    assert max(u.memory[t.name] for t in cores) == d.plan(NPU4).l1_bytes
    # every output once; the last N panel, moved back to end at N, writes some columns twice
    # (the same values; kernels/lower/gemm._panel_start): at most one panel of them per column
    extra = u.bytes_out - m * n * 4
    assert 0 <= extra <= m * d.plan(NPU4).tile[2] * NPU4.core_rows.value * 4 * prog_columns(prog)
    txn.encode_sequence(prog)


@pytest.mark.parametrize("op,shape,n_in", [("add", (999,), 2), ("mul", (3, 70001), 2),
                                            ("exp", (4097,), 1), ("softmax", (7, 333), 1),
                                            ("rms_norm", (5, 2048), 2)])
def test_vector_shape_sweep(op, shape, n_in):
    from torch_xdna.array import txn
    if op == "rms_norm":
        d = VectorDesign(op, (shape, shape[-1:]), (F32, F32), shape, F32,
                         (("eps", 1e-6), ("has_weight", True)))
    else:
        d = VectorDesign(op, (shape,) * n_in, (F32,) * n_in, shape, F32)
    (prog,) = lower(d, NPU4)
    u = validate(prog, NPU4)
    n = 1
    for s in shape:
        n *= s
    assert u.bytes_out == n * 4
    txn.encode_sequence(prog)


def test_unaligned_rows_are_named():
    from torch_xdna.kernels.lower import LoweringError
    with pytest.raises(LoweringError, match="32-bit words"):
        lower(GemmDesign(5, 64, 30, dtype="int8", out_dtype=torch.int32), NPU4)


def test_bfp16_tiles_pack_exactly():
    d = GemmDesign(16, 72, 40, dtype="bfp16")
    b = torch.randn(72, 40)
    packed = pack_bfp16_tiles(d, NPU4, b)
    (prog,) = lower(d, NPU4)
    arg = next(a for a in prog.sequence.args if a.name == "B")
    assert packed.numel() == arg.type.numel
    tm, tk, tn = d.plan(NPU4).tile
    first = quant.encode_bfp16(torch.nn.functional.pad(b.t()[0, :min(tk, 72)], (0, max(0, tk - 72))))
    assert torch.equal(packed[:tk // 8 * 9], first)


@pytest.mark.parametrize("prec", ["bf16", "int8", "int4"])
def test_llm_embed_rows_lower(prec):
    from torch_xdna.array import txn
    from torch_xdna.kernels.blocks.llm import EmbedDesign
    w = torch.randn(100, 64)
    tables = {"bf16": [w.bfloat16()], "int8": list(quant.quantize_int8(w, 32)),
              "int4": list(quant.quantize_int4(w, 32))}[prec]
    d = EmbedDesign(100, 64, 4, prec, 0 if prec == "bf16" else 32)
    (prog,) = lower(d, NPU4, inputs=[*tables, torch.tensor([3, 99, 0, 5], dtype=torch.int32)], n=3)
    u = validate(prog, NPU4)
    assert u.bytes_out == 3 * 64 * 4
    assert u.tasks == 1 + 3 * len(tables)             # one drain, one BD per row and table
    txn.encode_sequence(prog)


@pytest.mark.parametrize("shape,dims", [((16, 768), (-1,)), ((4, 8, 96), (1, 2)), ((6, 256), (1,))])
def test_row_reductions_lower(shape, dims):
    from torch_xdna.array import txn
    out_shape = shape[:len(shape) - len(dims)]
    d = VectorDesign("sum", (shape,), (F32,), out_shape, F32, (("dims", dims), ("keepdim", False)))
    (prog,) = lower(d, NPU4)
    u = validate(prog, NPU4)
    n_out = 1
    for s in out_shape:
        n_out *= s
    assert u.bytes_out == n_out * 4
    row = 1
    for s in shape:
        row *= s
    assert dict(prog.notes)["work"] % (row // n_out) == 0           # units of whole rows
    txn.encode_sequence(prog)


def test_non_trailing_reduction_is_named():
    from torch_xdna.kernels.lower import LoweringError
    d = VectorDesign("sum", ((16, 64),), (F32,), (64,), F32, (("dims", (0,)), ("keepdim", False)))
    with pytest.raises(LoweringError, match="trailing dims"):
        lower(d, NPU4)


def _gemm(m, k, n, dt, g=0, out=None):
    plain_int8 = dt == "int8" and not g
    return GemmDesign(m, k, n, dtype=dt, w_group=g,
                      out_dtype=out or (torch.int32 if plain_int8 else torch.bfloat16))


def _stream(d):
    from torch_xdna.array import txn
    (prog,) = lower(d, NPU4)
    return prog, txn.stream_stats(txn.encode_sequence(prog))


# (m, k, n, dtype, w_group): L2-blocked with B held in the mem tile (p M sub-blocks), edge tiles
# in M / N / K, GEMV, bfp16 and int8 / int4 weights (host-packed tiles padded to the grid)
_BLOCKED = [(256, 768, 768, "bf16", 0), (1024, 1024, 1024, "int8", 0), (1024, 1024, 1024, "bf16", 0),
            (300, 300, 500, "bf16", 0), (130, 96, 200, "int8", 0), (70, 128, 96, "bfp16", 0),
            (160, 128, 72, "int4", 32)]
_STREAM_SHAPES = _BLOCKED + [(1, 1024, 4096, "bf16", 0), (3, 256, 520, "bf16", 0),
                             (96, 256, 192, "int8", 32), (2, 512, 300, "int4", 64)]


@pytest.mark.parametrize("m,k,n,dt,g", _BLOCKED)
def test_gemm_stream_dram_bytes_equal_plan(m, k, n, dt, g):
    """The L2 blocking is lowered (B's K panel held in the mem tile and re-streamed to the p M
    sub-blocks): the stream's MM2S bytes, counted from the encoded words, are exactly the plan's
    modeled DRAM reads, its S2MM bytes the plan's writes (edge padding is not read or written)."""
    d = _gemm(m, k, n, dt, g)
    plan = d.plan(NPU4)
    assert plan.notes["b_panel_resident"] and plan.notes["l2_factors"][0] > 1
    prog, st = _stream(d)
    assert dict(prog.notes)["l2_factors_lowered"] == plan.notes["l2_factors"]
    assert st.mm2s_bytes == plan.dram_read_bytes
    assert st.s2mm_bytes == plan.dram_write_bytes


@pytest.mark.parametrize("m,k,n,dt,g", _STREAM_SHAPES)
def test_gemm_stream_bytes_equal_lowered_model(m, k, n, dt, g):
    """Everywhere (also where the plan's blocking is not lowered: q > 1, or K panels too big for
    a mem tile, which then use partial sums in the plan only) the plan's `lowered_read_bytes`
    is what the stream moves; it is >= the plan's figure, equal where the blocking is lowered."""
    d = _gemm(m, k, n, dt, g)
    plan = d.plan(NPU4)
    _, st = _stream(d)
    assert st.mm2s_bytes == plan.notes["lowered_read_bytes"]
    assert st.s2mm_bytes == plan.dram_write_bytes
    assert plan.notes["lowered_read_bytes"] >= plan.dram_read_bytes
    if plan.notes["b_panel_resident"] and not (g or dt == "bfp16"):
        assert plan.notes["lowered_read_bytes"] == plan.dram_read_bytes
    elif plan.notes["b_panel_resident"]:     # packed weight tiles are zero-padded to the grid
        assert plan.notes["lowered_read_bytes"] <= 1.02 * plan.dram_read_bytes


@pytest.mark.parametrize("m,k,n,dt,g", _STREAM_SHAPES)
def test_gemm_plan_memtile_is_the_lowered_one(m, k, n, dt, g):
    """The capacity check places A as the lowering does (a_columns(gm, cols) mem tiles, each
    m-slice from one of them: one channel per core), and where the blocking is lowered the
    plan's mem-tile figure is exactly the IR's fullest mem tile (validate.usage)."""
    from torch_xdna.array import validate
    from torch_xdna.kernels.ops.gemm import a_columns
    d = _gemm(m, k, n, dt, g)
    plan = d.plan(NPU4)
    gm, _ = plan.notes["grid"]
    prog, _ = _stream(d)
    a_feeds = [f for f in prog.fifos if f.name[0] == "A" and f.name[1:].isdigit()]
    assert len(a_feeds) == a_columns(gm, plan.columns)
    assert all(f.producer.kind == "shim" and f.consumers[0].kind == "mem" for f in a_feeds)
    assert plan.memtile_bytes <= NPU4.memtile_bytes.value
    used = validate.usage(prog).max_of("memory", "mem", prog)
    if not plan.notes["partial_sums_in_memtile"]:
        assert used == plan.memtile_bytes


def test_gemm_unlowered_blocking_is_named():
    """4096^3 bf16: K panels do not fit a mem tile, so the plan keeps partial sums in the mem
    tiles (what the calibration at 14.71 TFLOPS rests on), which the lowering does not do: it
    streams A and B per array block and says so in its notes (docs/array.md Known gaps)."""
    d = _gemm(4096, 4096, 4096, "bf16")
    plan = d.plan(NPU4)
    assert plan.notes["partial_sums_in_memtile"] and not plan.notes["b_panel_resident"]
    assert plan.notes["lowered_read_bytes"] > plan.dram_read_bytes
    (prog,) = lower(d, NPU4)
    assert dict(prog.notes)["l2_factors_lowered"] == (1, 1)


def test_gemm_memtile_figure_1024_bf16():
    """1024^3 bf16, worked by hand: tile 64x32x64, grid 4x8 on 8 columns, p = 4 M sub-blocks.
    The fullest mem tile (an A column, a_columns = 4) holds 2 x one K step of its A m-slice
    (64 x 32 x 2 B), 2 x the column's whole B K panel (1024 x 64 x 2 B, re-streamed 4 times)
    and 2 x its output join (4 x 64 x 64 x 2 B). (The old figure spread a held A chunk over all
    8 columns and counted partial sums the lowering does not need.)"""
    plan = _gemm(1024, 1024, 1024, "bf16").plan(NPU4)
    assert (plan.tile, plan.notes["grid"], plan.columns, plan.notes["l2_factors"]) == \
        ((64, 32, 64), (4, 8), 8, (4, 1))
    assert plan.memtile_bytes == 2 * 64 * 32 * 2 + 2 * 1024 * 64 * 2 + 2 * 4 * 64 * 64 * 2
    assert plan.dram_read_bytes == 1024 * 1024 * 2 * 2 + 1024 * 1024 * 2 * 1   # A twice, B once


def test_restreaming_link_pattern_must_cover_its_emits():
    """A link with emits > 1 whose destination pattern does not walk emits elements is named."""
    import dataclasses
    from torch_xdna.array import validate
    d = _gemm(300, 300, 500, "bf16")
    (prog,) = lower(d, NPU4)
    ln = next(x for x in prog.links if x.emits > 1)
    bad = dataclasses.replace(prog, links=tuple(dataclasses.replace(x, emits=x.emits + 1) if x is ln
                                               else x for x in prog.links))
    with pytest.raises(validate.ArrayIRError, match="emitting"):
        validate.validate(bad, NPU4)
