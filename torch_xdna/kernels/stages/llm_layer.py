"""The fused decoder layer as the stages its array program runs, and their functional order.

DecoderLayerDesign (blocks/llm.py) is one launch. On the array it runs as stages, each one
ArrayProgram (kernels/lower/llm_layer.py), wired through scratch DDR buffers named here:

  attn_norm     rms_norm rows (VectorDesign)          x, attn_norm        -> T_h   bf16 [R, H]
  qkv_proj      GEMM (GemmDesign, the plan's tiles)   T_h, w_qkv_t        -> T_qkv bf16 [R, QKV]
  qk_rope       per token: q/k heads RMS-normalized with their own weights, RoPE at position
                pos + i (the cos/signed_sin row read at a per-launch BD offset), rounded to
                bf16; q heads written head-major for attention (T_q [Hq, R, D]: the GQA layout,
                heads of a KV group adjacent), k and v rows written into the caches at pos + i
                bf16 (layers without q/k norm, Llama-style: RoPE only, qk_rope_bf16)
                                                      T_qkv, q_norm, k_norm, cs -> T_q, k_cache, v_cache
  attention     flash attention over the cache (AttentionDesign; kv_len = pos + n, q_offset =
                pos as launch scalars)                T_q, k_cache, v_cache -> T_a f32 [Hq, R, D]
  attn_cast     per token: the heads' rows -> token-major bf16       T_a -> T_ab bf16 [R, Hq*D]
  o_proj        GEMM                                  T_ab, w_o_t         -> T_o   f32 [R, H]
  attn_residual add (VectorDesign)                    T_o, x              -> T_x1  f32
  mlp_norm      rms_norm rows                         T_x1, mlp_norm      -> T_h2  bf16
  gate_up       GEMM                                  T_h2, w_gate_up_t   -> T_gu  bf16 [R, 2I]
  silu_mul      per token: silu(gate) * up, to bf16   T_gu                -> T_m   bf16 [R, I]
  down          GEMM                                  T_m, w_down_t       -> T_d   f32 [R, H]
  mlp_residual  add                                   T_d, T_x1           -> out

Host layouts (once per weight, `host_inputs`): bf16 GEMM weights as B = W^T [K, N], int8 /
int4 weight groups as their GEMM stage's packed tiles (weights and scales per tile), the RoPE
tables as cs [P, 2, D] bf16 (cos | sin with its first half negated).

`staged_reference` is the layer's functional reference in this order: every stage's own
functional reference (GemmDesign's K-tile order, AttentionDesign's flash order, the row ops) on
whole tensors, and the per-token stages' functions below, which the core-kernel references
(kernels/aie/refs.py) call per token. So the transaction level is bit-identical to it. The
layer's default reference (blocks/llm.py, BLAS GEMMs) is faster on the host and agrees with it
within fp32 reordering; numerics.layer_order() picks which one the functional level runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from torch_xdna.hw import NPU4
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.blocks.toolkit import rms_norm, rope
from torch_xdna.kernels.blocks.weights import STAGED_PRECISIONS, default_group, weight_tensors
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.ops.gemm import GemmDesign, UpstreamGemmDesign
from torch_xdna.kernels.ops.gemm_pack import pack_weight_tiles
from torch_xdna.kernels.ops.vector import VectorDesign

BF16, F32 = torch.bfloat16, torch.float32
WEIGHTS = ("w_qkv_t", "w_o_t", "w_gate_up_t", "w_down_t")
GATE_ACTS = ("silu", "gelu_tanh")        # the MLP gate's activation (silu_mul / gelu_tanh_mul)


@dataclass(frozen=True)
class Stage:
    """One stage: `design` (a Design lowered and referenced as is) or a per-token `kind`."""

    label: str
    kind: str                   # "design" | "qk_rope" | "attn_cast" | "silu_mul"
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    design: Any = None


_RUNS: dict = {}                   # design key -> its program_runs (a block's stages are fixed)


def cached_runs(d, stage_list: Callable[[Any], Sequence[Stage]]) -> tuple:
    """program_runs of block `d` run as `stage_list(d)`, computed once per design."""
    hit = _RUNS.get(d.key)
    if hit is None:
        hit = _RUNS[d.key] = program_runs(d.key, stage_list(d))
    return hit


def program_runs(key: tuple, stage_list: Sequence[Stage]) -> tuple:
    """Design.runs of a block that runs as `stage_list`: one entry per stage program, in order
    (a GEMM stage with a bias, activation or residual is its GEMM program then its epilogue
    program: kernels/lower/gemm.gemm_programs), so the cost model charges the kernel runs and
    configure points its staged artifact does."""
    out = []
    for st in stage_list:
        ds = st.design if st.kind == "design" else None
        two = ds is not None and ds.kind == "gemm" and (ds.bias or ds.residual
                                                        or ds.epilogue != "none")
        out += [(key, st.label, j) for j in range(2 if two else 1)]
    return tuple(out)


def unsupported(layer, n: int | None = None) -> str | None:
    """Why this layer does not run as stages (None: it does)."""
    a, m = layer.attention, layer.mlp
    if a.kind != "llm_attention":
        return f"{type(a).__name__} token mixer (only softmax attention is lowered as stages)"
    rows = a.rows if n is None else n
    checks = (
        (a.precision not in STAGED_PRECISIONS or m.precision != a.precision or m.group != a.group,
         f"precision {a.precision}/{m.precision} (stages lowered for one of "
         f"{', '.join(STAGED_PRECISIONS)}"
         " in both blocks)"),
        (a.kv_dtype != "bf16" or a.cache_bytes != 2, f"KV cache {a.kv_dtype} (bf16 only)"),
        (getattr(a, "sinks", False), "attention sinks"),
        (m.act not in GATE_ACTS, f"MLP activation {m.act} ({', '.join(GATE_ACTS)} only)"),
        (a.layer_norm or a.bias or not a.rope or not getattr(m, "gated", True),
         "LayerNorm, biases, learned positions or a non-gated MLP (OPT-style blocks)"),
        (not 0 < rows <= a.rows, f"{rows} valid rows of {a.rows}"),
    )
    for bad, why in checks:
        if bad:
            return why
    return None


def input_names(layer) -> tuple[str, ...]:
    """The stages' host arguments for the layer's inputs (host_inputs order: one tensor per
    weight, whatever its precision; q/k norm and post-norms when the layer has them)."""
    a, m = layer.attention, layer.mlp
    qk = ("q_norm", "k_norm") if a.qk_norm else ()
    post = (("post_attn_norm",) if a.post_norm else ()) + (("post_mlp_norm",) if m.post_norm else ())
    return ("x", "attn_norm", *qk, "w_qkv_t", "w_o_t", "cs", "mlp_norm",
            "w_gate_up_t", "w_down_t", *post)


OUTPUT_NAMES = ("out", "k_cache", "v_cache")


def dims(layer) -> dict:
    a, m = layer.attention, layer.mlp
    return dict(R=a.rows, H=a.hidden, Hq=a.heads, Hkv=a.kv_heads, D=a.head_dim,
                QKV=(a.heads + 2 * a.kv_heads) * a.head_dim, I=m.intermediate, S=a.capacity)


def attention_items(layer, gen=None) -> dict:
    """The attention stage's work items as the scratch buffers hold them (item layout, no edge
    padding on the chip): item w = KV head h, query tile t (w = h * q_tiles + t); T_q holds one
    whole stream element per item (E = 2 tkv rows of dp), T_a one output tile (rows of dp); row
    gi * tq + r of an item is query head h * group + gi at token t * tq + r. Rows past an item's
    valid ones are never written by qk_rope nor read by attn_cast."""
    a = next(st.design for st in stages(layer) if st.label == "attention")
    return item_layout(a, dims(layer)["R"], gen)


def item_layout(a: AttentionDesign, rows: int, gen=None) -> dict:
    """The item layout (see attention_items) of attention stage `a` over `rows` query rows."""
    g = gen or NPU4
    tq, tkv, dp = a.plan(g).tile
    q_tiles = -(-rows // tq)
    rm = g.mmul_shape.value["bf16"][0]
    core_rows = -(-a.group * tq // rm) * rm      # lower/attention.py: the core's query rows
    return dict(tq=tq, tkv=tkv, dp=dp, E=2 * tkv, g=a.group, q_tiles=q_tiles,
                items=a.kv_heads * q_tiles, rows=core_rows)


def item_rows(it: dict, i: int, hkv: int, d: int, per_item: int) -> tuple:
    """(offset, sizes, strides) of token i's query heads in an item-layout buffer (T_q: items
    of E rows, T_a: items of `per_item` rows; item_layout): head h * g + gi sits in item
    h * q_tiles + i // tq at row gi * tq + i % tq."""
    tq, dp, q_tiles = it["tq"], it["dp"], it["q_tiles"]
    off = ((i // tq) * per_item + i % tq) * dp
    return off, (hkv, it["g"], d), (q_tiles * per_item * dp, tq * dp, 1)


def scratch(layer, gen=None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Scratch DDR buffers between stages: name -> (shape, dtype); T_q and T_a in the attention
    stage's item layout (attention_items)."""
    d = dims(layer)
    R, H, Hq, D = d["R"], d["H"], d["Hq"], d["D"]
    it = attention_items(layer, gen)
    return {"T_h": ((R, H), BF16), "T_qkv": ((R, d["QKV"]), BF16),
            "T_q": ((it["items"], it["E"], it["dp"]), BF16),
            "T_a": ((it["items"], it["rows"], it["dp"]), F32), "T_ab": ((R, Hq * D), BF16), "T_o": ((R, H), F32),
            "T_x1": ((R, H), F32), "T_h2": ((R, H), BF16), "T_gu": ((R, 2 * d["I"]), BF16),
            "T_m": ((R, d["I"]), BF16), "T_d": ((R, H), F32),
            **({"T_op": ((R, H), F32)} if layer.attention.post_norm else {}),
            **({"T_dp": ((R, H), F32)} if layer.mlp.post_norm else {})}


def stages(layer) -> tuple[Stage, ...]:
    a, m = layer.attention, layer.mlp
    d = dims(layer)
    R, H = d["R"], d["H"]

    def norm(eps, offset, out=BF16):
        return VectorDesign("rms_norm", ((R, H), (H,)), (F32, F32), (R, H), out,
                            (("eps", eps), ("has_weight", True), ("weight_offset", float(offset))))

    def gemm(k, n, out):
        if a.precision == "bf16":
            return UpstreamGemmDesign(R, k, n, dtype="bf16", out_dtype=out)
        return UpstreamGemmDesign(R, k, n, dtype=a.precision, out_dtype=out,
                          w_group=a.group or default_group(a.precision))

    add = VectorDesign("add", ((R, H), (R, H)), (F32, F32), (R, H), F32)
    attn = AttentionDesign(1, a.heads, a.kv_heads, R, a.capacity, a.head_dim, causal=True,
                           scale=a.scale, window=a.window or 0, softcap=a.softcap or 0.0,
                           kv_tile=a.tkv)
    return (
        Stage("attn_norm", "design", ("x", "attn_norm"), ("T_h",), norm(a.eps, a.norm_offset)),
        Stage("qkv_proj", "design", ("T_h", "w_qkv_t"), ("T_qkv",), gemm(H, d["QKV"], BF16)),
        Stage("qk_rope", "qk_rope", ("T_qkv", *(("q_norm", "k_norm") if a.qk_norm else ()), "cs"),
              ("T_q", "k_cache", "v_cache")),
        Stage("attention", "design", ("T_q", "k_cache", "v_cache"), ("T_a",), attn),
        Stage("attn_cast", "attn_cast", ("T_a",), ("T_ab",)),
        Stage("o_proj", "design", ("T_ab", "w_o_t"), ("T_o",), gemm(a.heads * a.head_dim, H, F32)),
        *((Stage("attn_post_norm", "design", ("T_o", "post_attn_norm"), ("T_op",),
                 norm(a.eps, a.norm_offset, F32)),) if a.post_norm else ()),
        Stage("attn_residual", "design", ("T_op" if a.post_norm else "T_o", "x"), ("T_x1",), add),
        Stage("mlp_norm", "design", ("T_x1", "mlp_norm"), ("T_h2",), norm(m.eps, m.norm_offset)),
        Stage("gate_up", "design", ("T_h2", "w_gate_up_t"), ("T_gu",), gemm(H, 2 * d["I"], BF16)),
        Stage("silu_mul" if m.act == "silu" else f"{m.act}_mul", "silu_mul", ("T_gu",), ("T_m",),
              m.act),
        Stage("down", "design", ("T_m", "w_down_t"), ("T_d",), gemm(d["I"], H, F32)),
        *((Stage("mlp_post_norm", "design", ("T_d", "post_mlp_norm"), ("T_dp",),
                 norm(m.eps, m.norm_offset, F32)),) if m.post_norm else ()),
        Stage("mlp_residual", "design", ("T_dp" if m.post_norm else "T_d", "T_x1"), ("out",), add),
    )


def stage_scalars(st: Stage, pos: int, n: int) -> dict:
    """The launch scalars a stage's program takes (its stream depends on them, not its build):
    `pos` the first row's position, `n` the valid rows (rows past n are computed like the others
    but write no KV and are not attended to; their output rows are not defined)."""
    if st.label == "attention":
        return {"kv_len": pos + n, "q_offset": pos}
    if st.kind == "qk_rope":
        return {"pos": pos, "n": n}
    return {}


def cs_rows(pos: int, rows: int, positions: int) -> list[int]:
    """The RoPE table row each of `rows` tokens reads: its position, clamped to the table (rows
    past the valid ones may lie beyond it; their values are not used)."""
    return [min(pos + i, positions - 1) for i in range(rows)]


# -- host layouts ------------------------------------------------------------------------------
def split_inputs(layer, inputs: Sequence[torch.Tensor]) -> tuple[dict, dict]:
    """The layer's inputs (DecoderLayerDesign order) as (named tensors, weights: stage weight
    name -> its stored tensors: (W,) for bf16, (W, scales) for int8 / int4)."""
    nt = weight_tensors(layer.attention.precision)
    it = iter(inputs)
    take = lambda n: tuple(next(it) for _ in range(n))          # noqa: E731
    heads = ("x", "attn_norm", "q_norm", "k_norm") if layer.attention.qk_norm else ("x", "attn_norm")
    named = dict(zip(heads, take(len(heads))))
    weights = {"w_qkv_t": take(nt), "w_o_t": take(nt)}
    if layer.attention.post_norm:
        (named["post_attn_norm"],) = take(1)
    named["cos"], named["sin"], named["mlp_norm"] = take(3)
    weights["w_gate_up_t"], weights["w_down_t"] = take(nt), take(nt)
    if layer.mlp.post_norm:
        (named["post_mlp_norm"],) = take(1)
    return named, weights


def host_inputs(layer, inputs: Sequence[torch.Tensor], gen=None) -> list[torch.Tensor]:
    """The layer's inputs as the stages' host arguments (input_names order): bf16 weights as
    B = W^T [K, N]; int8 / int4 weights as their GEMM stage's packed tiles
    (ops/gemm_pack.pack_weight_tiles, for generation `gen`); the RoPE tables as cs [P, 2, D].
    Derived tensors are built once per weight (operands.OPERANDS: keyed by storage and
    version)."""
    named, weights = split_inputs(layer, inputs)
    cos, sin = named["cos"], named["sin"]
    gemms = {st.ins[1]: st.design for st in stages(layer) if st.ins[-1] in WEIGHTS}

    def wt(name):
        return stage_weight(gemms[name], weights[name], gen)

    def cs():
        c, s = numerics.operand(cos), numerics.operand(sin).clone()
        s[:, :s.shape[-1] // 2].neg_()
        return torch.stack([c, s], 1).to(BF16).contiguous()

    qk = [named["q_norm"], named["k_norm"]] if layer.attention.qk_norm else []
    return [named["x"], named["attn_norm"], *qk, wt("w_qkv_t"),
            wt("w_o_t"), OPERANDS.derived(("layer_cs",), (cos, sin), cs), named["mlp_norm"],
            wt("w_gate_up_t"), wt("w_down_t"),
            *(named[k] for k in ("post_attn_norm", "post_mlp_norm") if k in named)]


def stage_weight(gemm: GemmDesign, ws: Sequence[torch.Tensor], gen=None) -> torch.Tensor:
    """A stored weight (W [N, K], or W and its scales) as GEMM stage `gemm` takes it: bf16 as
    B = W^T [K, N], int8 / int4 as its packed tiles for `gen`; derived once per weight
    (operands.OPERANDS: keyed by storage and version)."""
    ws = tuple(ws)
    if gemm.dtype == "bf16":
        return OPERANDS.derived(("stage_wt",), ws,
                                lambda: numerics.operand(ws[0]).t().contiguous().to(BF16))
    g = gen or NPU4
    return OPERANDS.derived(("stage_pack", gemm.key, g.name), ws,
                            lambda: pack_weight_tiles(gemm, g, *ws))


# -- the per-token stages' numerics (also the core-kernel references) --------------------------
def qk_norm_rope_rows(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor,
                      eps: float, offset: float) -> torch.Tensor:
    """Heads x [..., rows, D] (bf16 values) normalized by their weight rows w [rows, D], rounded,
    rotated by cos / ssin [..., 1 or rows, D] (bf16 values), rounded: fp32 holding bf16."""
    rnd = numerics.operand
    y = rnd(rms_norm(rnd(x), rnd(w), eps, offset, rnd, rounded=True))
    return rnd(rope(y, rnd(cos), rnd(ssin)))


def qk_rope_rows(x: torch.Tensor, cos: torch.Tensor, ssin: torch.Tensor) -> torch.Tensor:
    """Heads x [..., rows, D] (bf16 values) rotated by cos / ssin (bf16 values), rounded: the
    qk stage of layers without q/k norm (qk_rope_bf16)."""
    rnd = numerics.operand
    return rnd(rope(rnd(x), rnd(cos), rnd(ssin)))


def gate_mul_rows(act: str, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The MLP gate in fp32 on bf16 operands as its core kernel computes it: silu(gate) * up
    (silu_mul_bf16_f32) or gelu_tanh(gate) * up (gelu_tanh_mul_bf16_f32, whose polynomial tanh
    golden.gelu_tanh_mul reproduces bit for bit)."""
    if act == "silu":
        return silu_mul_rows(g, u)
    from torch_xdna.kernels.aie import golden
    return golden.gelu_tanh_mul(numerics.operand(g), numerics.operand(u))


def silu_mul_rows(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in fp32 on bf16 operands (silu_mul_bf16_f32)."""
    return apply_epilogue("silu", numerics.operand(g)) * numerics.operand(u)


def cast_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16, nearest even, subnormals flushed (cast_f32_bf16)."""
    return numerics.operand(x.float()).to(BF16)


# -- the functional reference in stage order ---------------------------------------------------
def staged_reference(layer, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                     pos: int = 0, n: int | None = None, **_: Any) -> None:
    """DecoderLayerDesign's reference in the order its stage programs compute (see above)."""
    d = dims(layer)
    R, Hq, Hkv, D, S, I = d["R"], d["Hq"], d["Hkv"], d["D"], d["S"], d["I"]
    a = layer.attention
    n = R if n is None else int(n)
    named, weights = split_inputs(layer, inputs)
    t: dict[str, torch.Tensor] = dict(named)
    c, s_ = numerics.operand(named["cos"]), numerics.operand(named["sin"]).clone()
    s_[:, :D // 2].neg_()
    t["cs"] = torch.stack([c, s_], 1).to(BF16)
    t.update(zip(OUTPUT_NAMES, outputs))
    for name, (shape, dt) in scratch(layer).items():
        t[name] = torch.zeros(shape, dtype=dt)
    # the reference keeps q and the attention output head-major (the item layout only moves
    # rows, the values are the same)
    t["T_q"], t["T_a"] = torch.zeros((1, Hq, R, D), dtype=BF16), torch.zeros((1, Hq, R, D), dtype=F32)
    for st in stages(layer):
        if st.kind == "design" and st.ins[-1] in WEIGHTS:     # a GEMM on a stored weight
            ds = st.design
            ws = weights[st.ins[-1]]
            a_in = as_shape(t[st.ins[0]], (ds.m, ds.k))
            b_in = [numerics.operand(ws[0]).t()] if a.precision == "bf16" else list(ws)
            ds.reference([a_in, *b_in], [as_shape(t[st.outs[0]], out_shape(ds))])
        elif st.kind == "design":
            ds = st.design
            ins = [as_shape(t[nm], sh) for nm, sh in zip(st.ins, in_shapes(ds))]
            out = as_shape(t[st.outs[0]], out_shape(ds))
            ds.reference(ins, [out], **stage_scalars(st, pos, n))
        elif st.kind == "qk_rope":
            qkv = t["T_qkv"].float()
            heads = qkv[:, :(Hq + Hkv) * D].reshape(R, Hq + Hkv, D)
            cs = t["cs"][cs_rows(pos, R, t["cs"].shape[0])].float()
            if a.qk_norm:
                w = torch.cat([numerics.operand(t["q_norm"].reshape(1, D)).expand(Hq, D),
                               numerics.operand(t["k_norm"].reshape(1, D)).expand(Hkv, D)])
                y = qk_norm_rope_rows(heads, w, cs[:, 0:1], cs[:, 1:2], a.eps, a.norm_offset)
            else:
                y = qk_rope_rows(heads, cs[:, 0:1], cs[:, 1:2])
            t["T_q"].view(Hq, R, D).copy_(y[:, :Hq].transpose(0, 1))
            kc, vc = t["k_cache"].view(Hkv, S, D), t["v_cache"].view(Hkv, S, D)
            kc[:, pos:pos + n].copy_(y[:n, Hq:].transpose(0, 1))
            vc[:, pos:pos + n].copy_(t["T_qkv"][:n, (Hq + Hkv) * D:].reshape(n, Hkv, D).transpose(0, 1))
        elif st.kind == "attn_cast":
            t["T_ab"].copy_(cast_bf16(t["T_a"].view(Hq, R, D).transpose(0, 1).reshape(R, Hq * D)))
        elif st.kind == "silu_mul":
            gu = t["T_gu"]
            t["T_m"].copy_(cast_bf16(gate_mul_rows(st.design, gu[:, :I], gu[:, I:])))


def in_shapes(ds) -> tuple:
    """A stage design's inputs as its reference takes them (GEMM: A, B[, bias][, residual];
    attention: q, k, v[, mask])."""
    if ds.kind == "gemm":
        n, lead = ds.n, ((ds.batch,) if ds.batch > 1 else ())
        return ((*lead, ds.m, ds.k), (*lead, ds.k, n)) + (((n,),) if ds.bias else ()) + \
            (((*lead, ds.m, n),) if ds.residual else ())
    if ds.kind == "attention":
        q = (ds.batch, ds.heads, ds.q_len, ds.head_dim)
        kv = (ds.batch, ds.kv_heads, ds.kv_len, ds.head_dim)
        return (q, kv, kv) + ((ds.mask_shape,) if ds.mask else ())
    if ds.kind == "embedding":
        return ((ds.vocab, ds.dim), (ds.n_idx,))
    return tuple(ds.in_shapes)


def out_shape(ds) -> tuple:
    if ds.kind == "gemm":
        return ((ds.batch,) if ds.batch > 1 else ()) + (ds.m, ds.n)
    if ds.kind == "attention":
        return (ds.batch, ds.heads, ds.q_len, ds.head_dim)
    if ds.kind == "embedding":
        return (ds.n_idx, ds.dim)
    return tuple(ds.out_shape)


def as_shape(x: torch.Tensor, shape) -> torch.Tensor:
    """x viewed as `shape` (a copy only when x is not contiguous)."""
    return x.view(shape) if x.is_contiguous() else x.reshape(shape)
