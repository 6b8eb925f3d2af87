"""DecoderLayerDesign -> one executable ArrayProgram per stage (kernels/stages/llm_layer.py).

GEMM, norm, residual and attention stages are their designs' own lowerings (same tiling as
their plans), with host arguments renamed onto the layer's buffers. The per-token stages are
built here, each on one core (col 0) with the data layout in the runtime sequence's BDs:

  qk_rope   in  xcs: per token, the q and k heads of its T_qkv row, then the cs row of position
                pos + i (a BD at offset (pos + i) * 2D: the launch's position is a base-address
                patch, not a rebuild)
                qkw: the norm weight row of every head, once per launch (q_norm read Hq times
                and k_norm Hkv times by stride-0 BD dimensions)
            core qk_norm_rope_bf16, or qk_rope_bf16 without q/k norm (kernels/aie/aie2p/qk_rope.cc)
            out qk: q heads -> T_q in the attention stage's item layout (one whole stream
                element per work item, LS.attention_items), k heads -> k_cache[h, pos + i]
            v   shim 1 -> mem tile 1 -> shim 1: T_qkv's v heads -> v_cache[h, pos + i] (no core)
  attn_cast per token: T_a's Hq rows of token i (item layout) -> cast_f32_bf16 -> T_ab row i
  silu_mul  per token: gate and up halves of T_gu row i on two channels -> silu_mul_bf16_f32,
            cast_f32_bf16 -> T_m row i (in chunks of at most SILU_CHUNK elements: one task per
            half still carries the whole row, the FIFO splits it into elements)
Each token is one round of the sequence (its drains queued before its feeds, then awaited).
Only the runtime sequence depends on pos (and kv_len / q_offset of the attention stage): a new
position is a new stream of the same static configuration (tests check the programs' tiles,
fifos, links, cores and kernels are equal across positions).
"""
from __future__ import annotations

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.lower.builder import Builder, LoweringError, acq, call, elem, forever, \
    loop, rel, tt
from torch_xdna.kernels.stages import llm_layer as LS
from torch_xdna.kernels.lower.dispatch import lower_stage, rename_args


_STAGES: dict = {}                  # (layer, generation, stage, P, first) -> program


def layer_programs(d, gen: Generation, pos: int = 0, n: int | None = None, inputs=None,
                   **_) -> tuple[ir.ArrayProgram, ...]:
    """The executable stage programs of one launch at position `pos`. `inputs` (the launch's)
    give the RoPE tables' length P; without them P is the KV capacity."""
    why = LS.unsupported(d, n)
    if why:
        raise LoweringError(f"{d.name}: not lowered as executable stages: {why}")
    dm = LS.dims(d)
    pos, n = int(pos), dm["R"] if n is None else int(n)
    if pos < 0 or pos + n > dm["S"]:
        raise LoweringError(f"{d.name}: positions {pos}..{pos + n - 1} outside the KV "
                            f"capacity {dm['S']}")
    scratch = LS.scratch(d)
    positions = int(LS.split_inputs(d, inputs)[0]["cos"].shape[0]) if inputs else dm["S"]
    progs = []
    for st in LS.stages(d):
        scalars = LS.stage_scalars(st, pos, n)
        key = (d.key, gen.name, id(gen), st.label, positions, not progs)
        hit = None if scalars else _STAGES.get(key)
        if hit is not None:             # a stage without per-launch scalars: one program
            progs.append(hit)           # object for every position (its stream is cached too)
            continue
        if st.kind == "design":
            extra = {"item_io": True} if st.label == "attention" else {}
            p = lower_stage(st.design, gen, **scalars, **extra)
            names = [a.name for a in p.sequence.args]
            if len(names) != len(st.ins) + 1:
                raise LoweringError(f"{d.name}: stage {st.label} has {len(names)} host args")
            mapping = dict(zip(names, st.ins + st.outs))
        else:
            p = {"qk_rope": _qk_rope, "attn_cast": _attn_cast, "silu_mul": _silu_mul}[st.kind](
                d, gen, dm, pos, positions, n)
            mapping = {}
        used = (*st.ins, *st.outs)
        notes = {"stage": f"llm_layer.{st.label}",
                 "scratch_args": tuple(x for x in used if x in scratch)}
        if not progs:                   # the first stage names the launch's buffers
            notes.update(launch_args=LS.input_names(d) + LS.OUTPUT_NAMES,
                         host_layout="llm_layer_stages.host_inputs")
        p = rename_args(p, mapping, notes)
        if not scalars:
            if len(_STAGES) > 512:
                _STAGES.clear()
            _STAGES[key] = p
        progs.append(p)
    return tuple(progs)


def _qk_rope(d, gen, dm, pos, positions, n) -> ir.ArrayProgram:
    a = d.attention
    R, Hq, Hkv, D, S, QKV = dm["R"], dm["Hq"], dm["Hkv"], dm["D"], dm["S"], dm["QKV"]
    nh = Hq + Hkv
    b = Builder(f"{d.name}_qk_rope_R{R}", gen)
    b.arg("T_qkv", (R, QKV), "bf16")
    if a.qk_norm:
        b.arg("q_norm", (D,), "bf16")
        b.arg("k_norm", (D,), "bf16")
    b.arg("cs", (positions, 2, D), "bf16")
    it = LS.attention_items(d, gen)
    b.arg("T_q", (it["items"], it["E"], it["dp"]), "bf16")
    b.arg("k_cache", (Hkv, S, D), "bf16")
    b.arg("v_cache", (Hkv, S, D), "bf16")
    shim, core = b.shim(0), b.core(0, 0)
    xcs_t, w_t, qk_t = tt(((nh + 2) * D,), "bf16"), tt((nh * D,), "bf16"), tt((nh * D,), "bf16")
    b.fifo("xcs", shim, core, 2, xcs_t)
    if a.qk_norm:
        b.fifo("qkw", shim, core, 1, w_t)
    b.fifo("qk", core, shim, 2, qk_t)
    shim1, mem1 = b.shim(1), b.mem(1)
    v_t = tt((Hkv * D,), "bf16")
    b.fifo("v_in", shim1, mem1, 2, v_t)
    b.fifo("v_out", mem1, shim1, 2, v_t)
    b.link(["v_in"], ["v_out"])
    if a.qk_norm:
        work_t = tt((2 * D,), "f32")
        k = b.kernel("qk_norm_rope_bf16", (xcs_t, w_t, qk_t, work_t, "i32", "i32", "f32", "f32"))
        work = b.buffer("work_0_2", core, work_t)
        token = call(k, elem("xcs"), elem("qkw"), elem("qk"), ir.BufferRef(work),
                     ir.Const(nh, "i32"), ir.Const(D, "i32"),
                     ir.Const(float(a.eps), "f32"), ir.Const(float(a.norm_offset), "f32"))
    else:                                   # Llama-style: rope only (qk_rope.cc)
        k = b.kernel("qk_rope_bf16", (xcs_t, qk_t, "i32", "i32"))
        token = call(k, elem("xcs"), elem("qk"), ir.Const(nh, "i32"), ir.Const(D, "i32"))
    per_token = loop(R, acq("xcs"), acq("qk", "produce"), token, rel("xcs"), rel("qk", "produce"))
    body = (acq("qkw"), *per_token, rel("qkw")) if a.qk_norm else tuple(per_token)
    b.core_body(core, (forever(*body),))
    b.notes.update({"tokens": R, "valid": n, "heads": (Hq, Hkv), "head_dim": D, "position": pos})
    for i, c in enumerate(LS.cs_rows(pos, R, positions)):
        p = pos + i
        b.task("qk", "T_q", *LS.item_rows(it, i, Hkv, D, it["E"]))  # q heads, item layout
        if i < n:                                                 # k rows at the position
            b.task("qk", "k_cache", p * D, (Hkv, D), (S * D, 1))
            b.task("v_out", "v_cache", p * D, (Hkv, D), (S * D, 1))
        else:                                                     # not a valid row: dropped
            b.task("qk", "k_cache", 0, (0,), (1,), (Hkv * D,))
        if i == 0 and a.qk_norm:
            b.task("qkw", "q_norm", 0, (Hq, D), (0, 1))            # one weight row per head
            b.task("qkw", "k_norm", 0, (Hkv, D), (0, 1))
        b.task("xcs", "T_qkv", i * QKV, (nh * D,), (1,))
        b.task("xcs", "cs", c * 2 * D, (2 * D,), (1,))            # cos | signed sin at pos + i
        if i < n:
            b.task("v_in", "T_qkv", i * QKV + nh * D, (Hkv * D,), (1,))
        b.end_round()
    return b.build()


def _attn_cast(d, gen, dm, pos, positions, n) -> ir.ArrayProgram:
    R, Hq, D = dm["R"], dm["Hq"], dm["D"]
    b = Builder(f"{d.name}_attn_cast_R{R}", gen)
    it = LS.attention_items(d, gen)
    b.arg("T_a", (it["items"], it["rows"], it["dp"]), "f32")
    b.arg("T_ab", (R, Hq * D), "bf16")
    shim, core = b.shim(0), b.core(0, 0)
    in_t, out_t = tt((Hq * D,), "f32"), tt((Hq * D,), "bf16")
    b.fifo("a", shim, core, 2, in_t)
    b.fifo("o", core, shim, 2, out_t)
    k = b.kernel("cast_f32_bf16", (in_t, out_t, "i32"))
    b.core_body(core, (forever(*loop(R, acq("a"), acq("o", "produce"),
                                     call(k, elem("a"), elem("o"), ir.Const(Hq * D, "i32")),
                                     rel("a"), rel("o", "produce"))),))
    for i in range(R):
        b.task("o", "T_ab", i * Hq * D, (Hq * D,), (1,))
        b.task("a", "T_a", *LS.item_rows(it, i, dm["Hkv"], D, it["rows"]))   # token i, every head
        b.end_round()
    return b.build()


# silu_mul's elements per core call: 3 double-buffered bf16 FIFOs and an fp32 temporary take
# 16 bytes per element in L1 (32 KiB at 2048; a whole 6144-wide row would need 96 KiB)
SILU_CHUNK = 2048


def _silu_mul(d, gen, dm, pos, positions, n) -> ir.ArrayProgram:
    """Per token, its intermediate row in k equal chunks of at most SILU_CHUNK elements
    (elementwise: the chunking changes no value)."""
    R, I = dm["R"], dm["I"]
    k = next(c for c in range(1, I + 1) if I % c == 0 and I // c <= SILU_CHUNK)
    W = I // k
    b = Builder(f"{d.name}_silu_mul_R{R}", gen)
    b.arg("T_gu", (R, 2 * I), "bf16")
    b.arg("T_m", (R, I), "bf16")
    shim, core = b.shim(0), b.core(0, 0)
    h_t, f_t = tt((W,), "bf16"), tt((W,), "f32")
    b.fifo("g", shim, core, 2, h_t)
    b.fifo("u", shim, core, 2, h_t)
    b.fifo("o", core, shim, 2, h_t)
    sm = b.kernel(f"{d.mlp.act}_mul_bf16_f32", (h_t, h_t, f_t, "i32"))     # silu / gelu_tanh
    cast = b.kernel("cast_f32_bf16", (f_t, h_t, "i32"))
    tmp = ir.BufferRef(b.buffer("act_0_2", core, f_t))
    w = ir.Const(W, "i32")
    b.core_body(core, (forever(*loop(R * k, acq("g"), acq("u"), acq("o", "produce"),
                                     call(sm, elem("g"), elem("u"), tmp, w),
                                     call(cast, tmp, elem("o"), w),
                                     rel("g"), rel("u"), rel("o", "produce"))),))
    for i in range(R):
        b.task("o", "T_m", i * I, (I,), (1,))
        b.task("g", "T_gu", i * 2 * I, (I,), (1,))
        b.task("u", "T_gu", i * 2 * I + I, (I,), (1,))
        b.end_round()
    return b.build()


__all__ = ["layer_programs"]
