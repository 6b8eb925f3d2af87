"""The transaction level of the simulator against the functional level, and its faults.

Each design is lowered (kernels/lower), its runtime sequence encoded into an instruction stream
for the launch (array/txn.py), and the stream executed (runtime/sim/txn.py): shim BDs against the
host buffers, data through the object FIFOs and mem-tile links, core programs calling the
core-kernel references. Results are compared with the design's functional reference.

Bounds: integer, data-movement and elementwise designs must be bit-identical. Float GEMMs
(bf16, bfp16, int8/int4 weight groups) too: both levels accumulate in the plan's order, an
exact K-tile product rounded once to fp32 and added tile after tile (kernels/numerics.py
tile_dot / ktile_matmul), so they are asserted bit-identical.
"""
from __future__ import annotations

import pytest
import torch

import torch_xdna.kernels.aie.refs  # noqa: F401  (registers the core-kernel references)
from torch_xdna.array import ir
from torch_xdna.array import txn as T
from torch_xdna.hw import NPU4
from torch_xdna.hw import aie2p_regs as R
from torch_xdna.kernels.base import ceil_div
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.lower import lower
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.runtime.launch import Launch
from torch_xdna.runtime.sim import SimDevice, core_kernels, txn_level
from torch_xdna.runtime.sim import txn as S
from torch_xdna.runtime.sim.cost import stream_transfer_terms, transfer_terms
from torch_xdna.runtime.sim.txn_faults import (AddressFault, BdBusy, BdExhausted, LockDeadlock,
                                               MissingSync, PatternFault, SyncTimeout)


def _both(design, inputs, out_shape, out_dtype):
    func = torch.zeros(out_shape, dtype=out_dtype)
    design.reference(inputs, [func])
    txn = torch.zeros(out_shape, dtype=out_dtype)
    txn_level.TxnRunner(NPU4).run(design, inputs, [txn], {})
    return func, txn


def _ulps_bf16(a: torch.Tensor, b: torch.Tensor) -> int:
    ia = a.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    ib = b.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    return int((ia - ib).abs().max()) if a.numel() else 0


GEMM_SHAPES = [(64, 96, 80), (36, 100, 52), (1, 256, 128)]   # edge tiles; K not a tile multiple


@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
def test_gemm_int8_bit_identical(m, k, n):
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
    func, txn = _both(GemmDesign(m=m, k=k, n=n, dtype="int8", out_dtype=torch.int32), [a, b], (m, n),
                      torch.int32)
    assert torch.equal(func, txn)


FLOAT_GEMM_SHAPES = [(64, 96, 80), (33, 70, 50), (1, 256, 128), (37, 300, 300), (2, 1000, 200),
                     (200, 520, 72),     # edge tiles in M and N, K not a multiple of the K tile
                     (1, 256, 1000)]     # a GEMV whose last N panel moves back to end at N


def test_gemv_n_edge_panel_moves_back_instead_of_padding():
    """A head-like GEMV (N not a multiple of a column's panel): the last panel starts earlier
    so it ends at N, no task zero-pads (mlir-aie pads only on mem tiles), and the outputs two
    cores both write are the same values (test_gemm_bf16_bit_identical[1-256-1000])."""
    for dtype in ("bf16", "int4"):
        d = GemmDesign(m=1, k=256, n=1000, dtype=dtype, out_dtype=torch.float32,
                       w_group=32 if dtype == "int4" else 0)
        prog = lower(d, NPU4)[0]
        assert not [t for t in prog.sequence.tasks if any(t.pad_after)], dtype


@pytest.mark.parametrize("m,k,n", FLOAT_GEMM_SHAPES)
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gemm_bf16_bit_identical(m, k, n, out):
    g = torch.Generator().manual_seed(m * k + n)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    d = GemmDesign(m=m, k=k, n=n, dtype="bf16", out_dtype=out)
    assert ceil_div(k, d.plan(NPU4).tile[1]) > 1 or k <= 256     # several K tiles where K allows
    func, txn = _both(d, [a, b], (m, n), out)
    assert torch.equal(func, txn)


def test_ktile_order_is_the_plans(monkeypatch):
    """The functional GEMM follows the K tile order: one fp32 rounding per K tile, so it differs
    from a one-shot matmul and from another tile size, and equals the explicit tile loop."""
    from torch_xdna.kernels import numerics
    g = torch.Generator().manual_seed(5)
    a = numerics.operand(torch.randn(48, 520, generator=g))
    b = numerics.operand(torch.randn(520, 40, generator=g))
    loop = torch.zeros(48, 40)
    for k0 in range(0, 520, 32):
        loop += (a[:, k0:k0 + 32].double() @ b[k0:k0 + 32].double()).float()
    assert torch.equal(numerics.ktile_matmul(a, b, 32), loop)
    assert not torch.equal(numerics.ktile_matmul(a, b, 32), numerics.ktile_matmul(a, b, 256))
    batched = numerics.ktile_matmul(a.expand(3, 48, 520), b, 32)
    assert torch.equal(batched[2], loop)
    monkeypatch.setattr(numerics, "_KTILE_BLOCK_BYTES", 8 * 520 * 3 * 16)   # pieces of 16 rows/cols
    assert torch.equal(numerics.ktile_matmul(a.expand(3, 48, 520), b, 32)[1], loop)
    d = GemmDesign(m=48, k=520, n=40, dtype="bf16")
    out = torch.zeros(48, 40)
    d.reference([a, b], [out])
    assert torch.equal(out, numerics.ktile_matmul(a, b, d.k_tile()))
    monkeypatch.setenv("TORCH_XDNA_GEMM_ORDER", "blas")          # the host-speed opt-out
    d.reference([a, b], [out])
    assert torch.equal(out, a @ b)
    monkeypatch.setenv("TORCH_XDNA_GEMM_ORDER", "fastest")
    with pytest.raises(ValueError, match="not a GEMM order"):
        d.reference([a, b], [out])


@pytest.mark.parametrize("op,n,dt", [("add", 1000, torch.float32), ("add", 778, torch.bfloat16),
                                     ("mul", 4096, torch.bfloat16), ("silu", 778, torch.bfloat16),
                                     ("relu", 3000, torch.float32)])
def test_elementwise_bit_identical(op, n, dt):
    g = torch.Generator().manual_seed(n)
    arity = 2 if op in ("add", "mul") else 1
    ins = [torch.randn(n, generator=g).to(dt) for _ in range(arity)]
    d = VectorDesign(op, tuple((n,) for _ in ins), tuple(dt for _ in ins), (n,), dt)
    func, txn = _both(d, ins, (n,), dt)
    assert torch.equal(func, txn)


ROW_CASES = [
    ("softmax", (("dim", -1),), [((6, 50), torch.float32)]),
    ("softmax", (("dim", -1),), [((37, 64), torch.bfloat16)]),
    ("rms_norm", (("eps", 1e-6), ("has_weight", True)), [((19, 1024), torch.float32), ((1024,), torch.float32)]),
    ("rms_norm", (("eps", 1e-6), ("has_weight", True)), [((6, 64), torch.bfloat16), ((64,), torch.bfloat16)]),
    ("layer_norm", (("eps", 1e-5), ("has_bias", True), ("has_weight", True), ("norm_dims", 1)),
     [((6, 64), torch.float32), ((64,), torch.float32), ((64,), torch.float32)]),
]


@pytest.mark.parametrize("op,params,ins", ROW_CASES, ids=[f"{c[0]}-{c[2][0][0]}" for c in ROW_CASES])
def test_row_ops_bit_identical(op, params, ins):
    """Softmax and norms reduce each row on one core in one call: the functional level's row
    reductions are the same order, so results are bit-identical."""
    g = torch.Generator().manual_seed(len(op))
    xs = [torch.randn(s, generator=g).to(t) for s, t in ins]
    d = VectorDesign(op, tuple(s for s, _ in ins), tuple(t for _, t in ins), ins[0][0], ins[0][1], params)
    func, txn = _both(d, xs, ins[0][0], ins[0][1])
    assert torch.equal(func, txn)


def test_dma_designs_bit_identical():
    from torch_xdna.kernels.ops.dma import ConcatDesign, GatherDesign
    from torch_xdna.kernels.ops.vector import EmbeddingDesign
    cases = [
        (ConcatDesign(((3, 8), (5, 8)), torch.float32, 0, (8, 8)), [torch.randn(3, 8), torch.randn(5, 8)]),
        (ConcatDesign(((4, 6), (4, 10)), torch.bfloat16, 1, (4, 16)),
         [torch.randn(4, 6).bfloat16(), torch.randn(4, 10).bfloat16()]),
        (EmbeddingDesign(100, 64, 7, torch.bfloat16),
         [torch.randn(100, 64).bfloat16(), torch.tensor([3, 1, 99, 0, 5, 5, 42])]),
        (GatherDesign("index_select", ((10, 12), (4,)), torch.float32, (10, 4), (("dim", 1),)),
         [torch.randn(10, 12), torch.tensor([11, 0, 3, 3])]),
    ]
    for d, ins in cases:
        shape = getattr(d, "out_shape", None) or (ins[1].numel(), ins[0].shape[1])
        func, txn = _both(d, ins, shape, ins[0].dtype)
        assert torch.equal(func, txn), d.name


ATTN_CASES = [
    (dict(batch=1, heads=4, kv_heads=2, q_len=5, kv_len=40, head_dim=64, causal=True), {}),
    (dict(batch=1, heads=16, kv_heads=8, q_len=1, kv_len=256, head_dim=128, causal=True), {"kv_len": 100}),
    (dict(batch=2, heads=2, kv_heads=2, q_len=33, kv_len=33, head_dim=32), {}),
    (dict(batch=1, heads=4, kv_heads=1, q_len=3, kv_len=300, head_dim=64, causal=True, window=70,
          softcap=30.0), {"kv_len": 290}),
]


@pytest.mark.parametrize("kw,scalars", ATTN_CASES, ids=["gqa-causal", "decode-kv100", "prefill-edge",
                                                       "window-softcap"])
def test_attention_bit_identical(kw, scalars):
    """Flash-style attention: both levels fold the same key tiles (the plan's tkv) in the same
    order with the same update (kernels/attention.flash_tile: P = bf16(exp(s - m)) against the
    running max, exact tile products and sums rounded once to fp32): bit-identical."""
    from torch_xdna.kernels.ops.attention import AttentionDesign
    g = torch.Generator().manual_seed(kw["kv_len"])
    d = AttentionDesign(**kw)
    q = torch.randn(kw["batch"], kw["heads"], kw["q_len"], kw["head_dim"], generator=g).bfloat16()
    k = torch.randn(kw["batch"], kw["kv_heads"], kw["kv_len"], kw["head_dim"], generator=g).bfloat16()
    v = torch.randn(kw["batch"], kw["kv_heads"], kw["kv_len"], kw["head_dim"], generator=g).bfloat16()
    func = torch.zeros(q.shape)
    d.reference([q, k, v], [func], **scalars)
    txn = torch.zeros(q.shape)
    txn_level.TxnRunner(NPU4).run(d, [q, k, v], [txn], scalars)
    assert torch.equal(func, txn)
    ref = torch.zeros(q.shape)                 # and the design is attention: vs the one-shot softmax
    from torch_xdna.kernels.ops.attention import attention_reference
    n = scalars.get("kv_len", kw["kv_len"])
    ref = attention_reference(q, k[..., :n, :], v[..., :n, :], scale=d.softmax_scale,
                              causal=d.causal, q_offset=n - d.q_len, window=d.window or None,
                              softcap=d.softcap or None)
    assert float((func - ref).abs().max()) <= 2 ** -7 * float(v.float().abs().max())


def test_attention_reads_the_kv_len_tile_whole_whatever_the_stale_rows_hold():
    """A resident cache of capacity 256 holding 100 valid keys: the key tile holding kv_len is
    read whole (no shim edge padding), its stale rows are garbage (1e4 keys, NaN values) and add
    exactly nothing, so the levels stay bit-identical to the functional reference (which never
    looks past kv_len)."""
    from torch_xdna.kernels.ops.attention import AttentionDesign
    d = AttentionDesign(1, 4, 2, 1, 256, 64, causal=True)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 1, 64, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 256, 64, generator=g).bfloat16() for _ in range(2))
    k[..., 100:, :], v[..., 100:, :] = 1e4, float("nan")
    kv_tasks = [t for t in lower(d, NPU4, kv_len=100)[0].sequence.tasks if t.arg in ("k", "v")]
    assert all(t.sizes[0] == d.plan(NPU4).tile[1] for t in kv_tasks if t.elements)
    assert not any(t.pad_after for t in kv_tasks if t.elements)      # only all-zero past tiles pad
    func, txn = torch.zeros(q.shape), torch.zeros(q.shape)
    d.reference([q, k, v], [func], kv_len=100)
    txn_level.TxnRunner(NPU4).run(d, [q, k, v], [txn], {"kv_len": 100})
    assert torch.isfinite(txn).all() and torch.equal(func, txn)


@pytest.mark.parametrize("m,k,n,dt", [(4, 64, 96, "bf16"), (1, 256, 128, "int8")])
def test_staged_gated_gemm_bit_identical(m, k, n, dt):
    """A three-stage launch (gate GEMM -> T0, up GEMM -> T1, gate_mul -> out) through scratch
    host buffers, each stage its own stream."""
    from torch_xdna.kernels.ops.fused import GatedGemmDesign
    g = torch.Generator().manual_seed(k)
    if dt == "int8":
        ins = [torch.randint(-128, 128, s, dtype=torch.int8, generator=g) for s in ((m, k), (k, n), (k, n))]
    else:
        ins = [torch.randn(s, generator=g) for s in ((m, k), (k, n), (k, n))]
    d = GatedGemmDesign(m=m, k=k, n=n, dtype=dt)
    func = torch.zeros(m, n)
    d.reference(ins, [func])
    txn = torch.zeros(m, n)
    runner = txn_level.TxnRunner(NPU4)
    runner.run(d, ins, [txn], {})
    assert runner.last["stages"] == 3
    assert torch.equal(func, txn)


@pytest.mark.parametrize("kw", [dict(bias=True, epilogue="gelu"), dict(bias=True, residual=True, epilogue="silu")])
def test_gemm_epilogue_stage_bit_identical(kw, monkeypatch):
    """GEMM + bias/activation/residual: the GEMM stage writes fp32 to scratch T, the epilogue
    stage finishes the rows. gemm_programs does not name its launch_args yet, so the test adds
    them the way fused.py's staged lowerings do."""
    from torch_xdna.kernels.lower.fused import rename_args

    def lowerer(d, gen, **launch):
        progs = lower(d, gen, **launch)
        la = ("A", "B") + (("bias",) if d.bias else ()) + (("R",) if d.residual else ()) + ("C",)
        return (rename_args(progs[0], {}, {"launch_args": la, "scratch_args": ("T",)}),) + progs[1:]

    monkeypatch.setattr(txn_level, "_lowerer", lowerer)
    m, k, n = 8, 64, 96
    g = torch.Generator().manual_seed(n)
    d = GemmDesign(m=m, k=k, n=n, dtype="bf16", out_dtype=torch.float32, **kw)
    ins = [torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)]
    if d.residual:
        ins.append(torch.randn(m, n, generator=g))
    func, txn = _both(d, ins, (m, n), torch.float32)
    assert torch.equal(func, txn)


@pytest.mark.parametrize("m,k,n", [(64, 96, 80), (33, 72, 50), (1, 256, 128), (40, 520, 36)])
def test_gemm_bfp16(m, k, n):
    """bfp16: B^T packed per tile as bfp16 blocks on the host (pack_bfp16_tiles), A block-
    quantized on the core; bit-identical (same K-tile order at both levels)."""
    g = torch.Generator().manual_seed(m + n)
    a, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    func, txn = _both(GemmDesign(m=m, k=k, n=n, dtype="bfp16", out_dtype=torch.float32), [a, b], (m, n),
                      torch.float32)
    assert torch.equal(func, txn)


@pytest.mark.parametrize("m,k,n,dt,grp", [(1, 256, 128, "int8", 32), (1, 256, 96, "int4", 32),
                                         (4, 128, 64, "int8", 64), (3, 640, 72, "int4", 32)])
def test_weight_only_gemm_bit_identical(m, k, n, dt, grp):
    """Weight-only GEMV/GEMM: W and scales packed per tile on the host (pack_weight_tiles), each
    core dequantizes its tile to bf16 and accumulates K tile by K tile, as the functional level."""
    from torch_xdna.kernels import quant
    g = torch.Generator().manual_seed(k + n)
    lo, hi = (-8, 8) if dt == "int4" else (-128, 128)
    w = torch.randint(lo, hi, (n, k), dtype=torch.int8, generator=g)
    wq = quant.pack_int4(w) if dt == "int4" else w
    sc = (torch.rand(n, k // grp, generator=g) * 0.1).to(torch.bfloat16)
    a = torch.randn(m, k, generator=g)
    d = GemmDesign(m=m, k=k, n=n, dtype=dt, w_group=grp, out_dtype=torch.float32)
    func, txn = _both(d, [a, wq, sc], (m, n), torch.float32)
    assert torch.equal(func, txn)


@pytest.mark.parametrize("shape,w", [((300, 70), (70,)), ((1000,), (1000,))], ids=["bcast-row", "flat"])
def test_fused_chain_bit_identical(shape, w):
    """silu(x * 2 + y) * w as one generated kernel per unit (w broadcast over rows: resident)."""
    from torch_xdna.kernels.ops.fused import ChainDesign
    steps = (("mul", (("in", 0), 2.0), ()), ("add", (("s", 0), ("in", 1)), ()), ("silu", (("s", 1),), ()),
             ("mul", (("s", 2), ("in", 2)), ()))
    d = ChainDesign((shape, shape, w), ("float32",) * 3, steps, (3,), ("float32",))
    g = torch.Generator().manual_seed(7)
    ins = [torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.randn(w, generator=g)]
    func, txn = _both(d, ins, shape, torch.float32)
    assert torch.equal(func, txn)


@pytest.mark.parametrize("mask_bool", [False, True], ids=["additive", "bool"])
def test_masked_attention_bit_identical(mask_bool):
    """The mask tile rides after K and V in the core's byte element; bit-identical as above."""
    from torch_xdna.kernels.ops.attention import AttentionDesign
    g = torch.Generator().manual_seed(11)
    d = AttentionDesign(batch=1, heads=2, kv_heads=2, q_len=7, kv_len=40, head_dim=32, mask=True,
                        mask_shape=(1, 1, 7, 40), mask_bool=mask_bool)
    q = torch.randn(1, 2, 7, 32, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 40, 32, generator=g).bfloat16() for _ in range(2))
    m = torch.rand(1, 1, 7, 40, generator=g) > 0.3 if mask_bool else torch.randn(1, 1, 7, 40, generator=g)
    func, txn = _both(d, [q, k, v, m], tuple(q.shape), torch.float32)
    assert torch.equal(func, txn)


def test_sim_device_level_switch_and_stream_costs():
    """The same launch at both levels of one SimDevice: identical output; at the txn level the
    DMA term is counted from the stream (its BDs' bytes), a new shape is a new stream."""
    dev = SimDevice(NPU4, 1 << 30)
    a = torch.randint(-128, 128, (64, 96), dtype=torch.int8)
    b = torch.randint(-128, 128, (96, 80), dtype=torch.int8)
    d = GemmDesign(m=64, k=96, n=80, dtype="int8", out_dtype=torch.int32)
    A, B = dev.upload(a), dev.upload(b)
    outs = []
    for lvl in ("functional", "txn"):
        C = dev.empty((64, 80), torch.int32)
        dev.trace = []
        with txn_level.use(lvl):
            dev.run(Launch(d, [A, B], [C]))
        outs.append((dev.download(C), dev.trace[-1].terms))
    assert torch.equal(outs[0][0], outs[1][0])
    prog = lower(d, NPU4)[0]
    words = T.encode_sequence(prog, T.LaunchBinding.of([a.numel(), b.numel(), 64 * 80 * 4]))
    stats = T.stream_stats(words)
    assert dev.txn.last["mm2s_bytes"] == stats.mm2s_bytes and dev.txn.last["words"] == stats.words
    counted = stream_transfer_terms(NPU4, dev.plan_for(d), stats)
    assert outs[1][1]["dma"] == pytest.approx(counted.dma)
    assert outs[1][1]["sync"] == pytest.approx(counted.sync)
    assert outs[0][1]["dma"] == pytest.approx(transfer_terms(NPU4, dev.plan_for(d)).dma)
    assert dev.txn.fallbacks == 0 and dev.txn.launches == 1


def test_env_selects_level(monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_SIM_LEVEL", "txn")
    assert txn_level.level() == "txn"
    monkeypatch.setenv("TORCH_XDNA_SIM_LEVEL", "cycle")
    with pytest.raises(Exception, match="not a simulation level"):
        txn_level.level()


def test_eager_ops_at_txn_level(monkeypatch):
    """TORCH_XDNA_SIM_LEVEL=txn is read per launch: eager ops on the xdna device run their
    streams (broadcast operands bound by their base buffer) and agree with the functional level."""
    import torch_xdna  # noqa: F401
    from torch_xdna.runtime import get_device
    g = torch.Generator().manual_seed(3)
    a = torch.randn(64, 96, generator=g)
    outs = {}
    for lvl in ("functional", "txn"):
        monkeypatch.setenv("TORCH_XDNA_SIM_LEVEL", lvl)
        outs[lvl] = ((a.to("xdna") + 1.5).cpu(), torch.softmax(a.to("xdna"), -1).cpu())
    dev = get_device()
    assert dev.txn.launches >= 2 and not dev.txn.fallback_reasons
    for f, t in zip(outs["functional"], outs["txn"]):
        assert torch.equal(f, t)


# --- a data-movement design built by hand: shim -> mem tile -> shim -----------------------------
def _copy_program(chunks: int, elems: int, bd_of=None, out_bd: int = 0) -> ir.ArrayProgram:
    shim, mem = ir.Tile(0, 0, "shim"), ir.Tile(0, 1, "mem")
    t = ir.TensorType((elems,), "i32")
    fifos = (ir.ObjectFifo("in", shim, (mem,), 2, t), ir.ObjectFifo("out", mem, (shim,), 2, t))
    n = chunks * elems
    args = (ir.HostArg("x", ir.TensorType((n,), "i32")), ir.HostArg("y", ir.TensorType((n,), "i32")))
    ops = [ir.DmaTask(0, "out", "y", 0, (n,), (1,), "S2MM", 0, 0, out_bd, issue_token=True)]
    for i in range(chunks):
        bd = bd_of(i) if bd_of else 1 + i % 3
        ops.append(ir.DmaTask(1 + i, "in", "x", i * elems, (elems,), (1,), "MM2S", 0, 0, bd))
        if not bd_of and i % 3 == 2:
            ops.append(ir.Await((1 + i,)))
    ops.append(ir.Await((0,)))
    return ir.ArrayProgram("copy", "npu4", (shim, mem), fifos, (ir.FifoLink(("in",), ("out",)),),
                           sequence=ir.RuntimeSequence(args, tuple(ops)))


def _fix_mm2s_tokens(prog):
    """The MM2S tasks _copy_program awaits issue a token (one sync consumes one token)."""
    awaited = {t for o in prog.sequence.ops if isinstance(o, ir.Await) for t in o.tasks}
    ops = tuple(ir.DmaTask(**{**o.__dict__, "issue_token": o.id in awaited})
                if isinstance(o, ir.DmaTask) else o for o in prog.sequence.ops)
    return ir.ArrayProgram(prog.name, prog.generation, prog.tiles, prog.fifos, prog.links,
                           sequence=ir.RuntimeSequence(prog.sequence.args, ops))


def _run_copy(prog, words=None, n=None):
    n = n or prog.sequence.args[0].type.numel
    x = torch.arange(n, dtype=torch.int32) * 7 - 3
    y = torch.zeros(n, dtype=torch.int32)
    words = words or T.encode_sequence(prog, T.LaunchBinding.of([4 * n, 4 * n]))
    S.execute(prog, words, [x.view(torch.uint8), y.view(torch.uint8)])
    return x, y


def test_data_movement_copy_bit_identical():
    prog = _fix_mm2s_tokens(_copy_program(9, 64))
    x, y = _run_copy(prog)
    assert torch.equal(x, y)


# --- corrupted streams ------------------------------------------------------------------------
def _ops(words):
    return list(T.decode(words).ops)


def _gemm_stream():
    d = GemmDesign(m=64, k=96, n=80, dtype="int8", out_dtype=torch.int32)
    prog = lower(d, NPU4)[0]
    a = torch.randint(-128, 128, (64, 96), dtype=torch.int8)
    b = torch.randint(-128, 128, (96, 80), dtype=torch.int8)
    host = [a.reshape(-1).view(torch.uint8).clone(), b.reshape(-1).view(torch.uint8).clone(),
            torch.zeros(64 * 80 * 4, dtype=torch.uint8)]
    words = T.encode_sequence(prog, T.LaunchBinding.of([h.numel() for h in host]))
    return prog, host, words


def _reencode(ops):
    return T.encode(ops, T.Header())


def test_fault_wrong_stride_is_an_address_fault():
    prog, host, words = _gemm_stream()
    ops = _ops(words)
    k = next(i for i, o in enumerate(ops) if isinstance(o, T.BlockWrite) and T.bd_register(o.addr)
             and T.unpack_shim_bd(o.data).d1_size > 1)
    bd = T.unpack_shim_bd(ops[k].data)
    ops[k] = T.BlockWrite(ops[k].addr, tuple(T.pack_shim_bd(T.ShimBD(**{**bd.__dict__,
                                                                          "d1_stride": 4000}))))
    with pytest.raises(AddressFault, match="d1 .*/4000"):
        S.execute(prog, _reencode(ops), host)


def test_fault_out_of_range_patch():
    prog, host, words = _gemm_stream()
    ops = _ops(words)
    k = next(i for i, o in enumerate(ops) if isinstance(o, T.DdrPatch))
    ops[k] = T.DdrPatch(ops[k].addr, ops[k].arg_idx, ops[k].arg_plus + host[ops[k].arg_idx].numel())
    with pytest.raises(AddressFault, match="host buffer"):
        S.execute(prog, _reencode(ops), host)


def test_fault_missing_final_sync():
    prog, host, words = _gemm_stream()
    ops = _ops(words)
    last = max(i for i, o in enumerate(ops) if isinstance(o, T.Sync)
               and o.direction == T.DIRECTION_CODE["S2MM"])
    del ops[last]
    with pytest.raises(MissingSync, match="never awaited"):
        S.execute(prog, _reencode(ops), host)


def test_fault_missing_push_times_out():
    prog, host, words = _gemm_stream()
    ops = _ops(words)
    k = next(i for i, o in enumerate(ops) if isinstance(o, T.Write32) and (p := T.decode_push(o))
             and p.direction == "S2MM")
    del ops[k]
    with pytest.raises((SyncTimeout, PatternFault)) as e:
        S.execute(prog, _reencode(ops), host)
    assert "ERT_CMD_STATE_TIMEOUT" in str(e.value) or "carries" in str(e.value)


def test_fault_bd_reuse_while_busy():
    # without the awaits every third task, BD 1 is rewritten while its first task is unfinished
    prog = _copy_program(4, 64, bd_of=lambda i: 1 if i in (0, 3) else 1 + i)
    with pytest.raises(BdBusy, match="BD 1 is still in flight"):
        _run_copy(prog)


def test_fault_bd_exhaustion():
    # the drain holds BD 0 and 15 feeds take BDs 1..15 with no sync: a 16th feed finds none free
    prog = _copy_program(16, 16, bd_of=lambda i: 1 + i if i < 15 else 1)
    with pytest.raises(BdExhausted, match=f"all {R.SHIM_BDS.value} BDs of column 0"):
        _run_copy(prog)


def test_fault_task_queue_overflow():
    """Feeds pushed while nothing drains the FIFO past its buffers: the fifth unfinished task on
    one channel overflows the task queue (depth 4)."""
    from torch_xdna.runtime.sim.txn_faults import TaskQueueOverflow
    base = _copy_program(15, 64, bd_of=lambda i: 1 + i)
    ops = list(base.sequence.ops)
    ops[0] = ir.DmaTask(0, "out", "y", 0, (64,), (1,), "S2MM", 0, 0, 0, issue_token=True)  # drains one chunk
    prog = ir.ArrayProgram(base.name, base.generation, base.tiles, base.fifos, base.links,
                           sequence=ir.RuntimeSequence(base.sequence.args, tuple(ops)))
    with pytest.raises(TaskQueueOverflow, match="queue depth 4"):
        _run_copy(prog)


def test_fault_lock_deadlock():
    """Two cores, each waiting for the other's output before producing its own."""
    core_kernels.register("txn_test_copy", lambda src, dst: dst.copy_(src))
    shim, mem = ir.Tile(0, 0, "shim"), ir.Tile(0, 1, "mem")
    c2, c3 = ir.Tile(0, 2, "compute"), ir.Tile(0, 3, "compute")
    t = ir.TensorType((16,), "i32")
    fifos = (ir.ObjectFifo("x", c2, (c3,), 1, t), ir.ObjectFifo("y", c3, (c2,), 1, t),
             ir.ObjectFifo("out", c2, (shim,), 1, t))
    body2 = (ir.Acquire("y", "consume"), ir.Acquire("x", "produce"),
             ir.Call("txn_test_copy", (ir.FifoElem("y"), ir.FifoElem("x"))),
             ir.Release("y", "consume"), ir.Release("x", "produce"))
    body3 = (ir.Acquire("x", "consume"), ir.Acquire("y", "produce"),
             ir.Call("txn_test_copy", (ir.FifoElem("x"), ir.FifoElem("y"))),
             ir.Release("x", "consume"), ir.Release("y", "produce"))
    args = (ir.HostArg("y", ir.TensorType((16,), "i32")),)
    seq = ir.RuntimeSequence(args, (ir.DmaTask(0, "out", "y", 0, (16,), (1,), "S2MM", 0, 0, 0, True),
                                    ir.Await((0,))))
    prog = ir.ArrayProgram("deadlock", "npu4", (shim, mem, c2, c3), fifos,
                           cores=(ir.CoreBody(c2, body2), ir.CoreBody(c3, body3)), sequence=seq)
    words = T.encode_sequence(prog)
    with pytest.raises(LockDeadlock, match="core_0_2 waits to acquire from 'y'"):
        S.execute(prog, words, [torch.zeros(64, dtype=torch.uint8)])


def test_new_shape_is_a_new_stream_not_a_rebuild():
    """Two launch bindings of one program: two streams, the static design untouched."""
    prog = _fix_mm2s_tokens(_copy_program(4, 64))
    w1 = T.encode_sequence(prog, T.LaunchBinding.of([1024, 1024]))
    with pytest.raises(T.StreamError, match="holds 512 bytes"):
        T.encode_sequence(prog, T.LaunchBinding.of([512, 1024]))
    assert T.stream_stats(w1).bd_writes == 5


@pytest.mark.parametrize("m,k,n,dt,grp", [(200, 300, 500, "bf16", 0), (130, 96, 200, "int8", 0),
                                         (70, 128, 96, "bfp16", 0), (96, 256, 64, "int8", 32),
                                         (160, 128, 72, "int4", 32)])
def test_gemm_l2_blocked_bit_identical(m, k, n, dt, grp):
    """L2-blocked GEMMs (B's K panel held in the mem tile, re-streamed to the plan's p M
    sub-blocks by a link with emits > 1; edge tiles, zero-padded sub-blocks): the txn level is
    bit-identical to the functional level."""
    from torch_xdna.kernels import quant
    g = torch.Generator().manual_seed(m + k + n)
    out = torch.int32 if dt == "int8" and not grp else torch.float32
    d = GemmDesign(m=m, k=k, n=n, dtype=dt, w_group=grp, out_dtype=out)
    assert d.plan(NPU4).notes["b_panel_resident"] and d.plan(NPU4).notes["l2_factors"][0] > 1
    if grp:
        lo, hi = (-8, 8) if dt == "int4" else (-128, 128)
        w = torch.randint(lo, hi, (n, k), dtype=torch.int8, generator=g)
        sc = (torch.rand(n, k // grp, generator=g) * 0.1).to(torch.bfloat16)
        ins = [torch.randn(m, k, generator=g), quant.pack_int4(w) if dt == "int4" else w, sc]
    elif dt == "int8":
        ins = [torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g),
               torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)]
    else:
        ins = [torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)]
    func, txn = _both(d, ins, (m, n), out)
    assert torch.equal(func, txn)
