"""Multi-stage designs -> one ArrayProgram per stage, run in order within one launch (a
configure point between stages; the hw cost `configure_point_us`).

Host arguments are matched by name across the stages of a launch. The first program's notes
hold `launch_args` (the design's inputs then outputs, in the reference's order) and every
program's notes its `scratch_args` (intermediates in DDR that the launcher allocates).

  gated_gemm     A @ Wg (act in the store) -> T0; A @ Wu -> T1; gate_mul(T0, T1) -> out
  prologue_gemm  the chain (kept outputs, and A -> T0); the GEMM on T0
  llm head       executable stages (kernels/lower/llm_head.py) when stages/llm_head.py supports it
  llm blocks     the stage designs their plans are built from (AttentionBlockDesign.plan_at /
                 MlpBlockDesign.plan / HeadDesign.plan), each lowered with its own tiling and
                 wired through scratch buffers. These programs give the structure, BDs and
                 stream size of a fused block; the layer's data layout between stages (RoPE
                 tables, the KV-cache write at `pos`, GQA head grouping) is not modeled, so
                 they are not executed at the transaction level.
"""
from __future__ import annotations

import torch

from torch_xdna.array import ir
from torch_xdna.hw import Generation
from torch_xdna.kernels.base import round_up
from torch_xdna.kernels.blocks.toolkit import KV_TILE, gemm_design, kv_bucket
from torch_xdna.kernels.lower.builder import LoweringError
from torch_xdna.kernels.lower.dispatch import lower_stage, rename_args
from torch_xdna.kernels.lower.llm_head import head_programs
from torch_xdna.kernels.lower.llm_layer import layer_programs
from torch_xdna.kernels.lower.vector import Operand, stream_program
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.kernels.ops.vector import VectorDesign


def gated_gemm_programs(d, gen: Generation, **_) -> tuple[ir.ArrayProgram, ...]:
    g = lower_stage(d._gemm(d.n, d.act), gen)
    u = lower_stage(d._gemm(d.n), gen)
    m = d.batch * d.m * d.n
    out_dt = {torch.float32: "f32", torch.bfloat16: "bf16"}.get(d.out_dtype, "f32")
    plan = d.plan(gen)
    cores = min(gen.cores, max(1, -(-m // 1024)))
    cols = min(gen.columns.value, -(-cores // gen.core_rows.value))
    work = 1024 if m >= 1024 else m
    gate = stream_program(
        f"{d.name}_gate", gen, work=work, n_units=-(-m // work), cores=cores, cols=cols, depth=2,
        streamed=[Operand("T0", "f32", m, work), Operand("T1", "f32", m, work)], resident=[],
        outputs=[Operand("out", out_dt, m, work)], kernel=f"gate_mul_f32_{out_dt}",
        packed_kernel=f"gate_mul_pk_f32_{out_dt}",
        notes={"stage": "gate", "scratch_args": ("T0", "T1")})
    return (rename_args(g, {"B": "Wg", "C": "T0"}, {"stage": "gate_proj", "launch_args": ("A", "Wg", "Wu", "out"),
                                                    "scratch_args": ("T0",), "plan_tile": plan.tile}),
            rename_args(u, {"B": "Wu", "C": "T1"}, {"stage": "up_proj", "scratch_args": ("T1",)}),
            gate)


def prologue_gemm_programs(d, gen: Generation, **_) -> tuple[ir.ArrayProgram, ...]:
    chain = lower_stage(d.chain, gen)
    gemm = lower_stage(d.gemm, gen)
    n_in = len(d.chain.in_shapes)
    kept = [k for k, keep in enumerate(d.keep) if keep]
    mapping = {f"out{d.a_out}": "T0"}
    for j, k in enumerate(kept):
        if k != d.a_out:
            mapping[f"out{k}"] = f"kept{j}"
    chain = rename_args(chain, mapping, {"stage": "prologue", "scratch_args": ("T0",)})
    gemm = rename_args(gemm, {"A": "T0"}, {"stage": "gemm"})
    launch = tuple(f"in{i}" for i in range(n_in)) + ("B",) + tuple(f"kept{j}" for j in range(len(kept))) + ("C",)
    chain = rename_args(chain, {}, {"launch_args": launch})
    return (chain, gemm)


# --- fused LLM blocks ---------------------------------------------------------------------------
def _stage_designs(d, gen):
    """(label, design, inputs, output) of a block's stages, as its plan builds them."""
    f32 = torch.float32
    gemm = gemm_design

    def vec(op, rows, dim, n_in=1):
        params = {"rms_norm": (("eps", 1e-6), ("has_weight", n_in > 1))}.get(op, ())
        shapes = ((rows, dim),) + ((dim,),) * (n_in - 1) if op == "rms_norm" else ((rows, dim),) * n_in
        return VectorDesign(op, shapes, (f32,) * n_in, (rows, dim), f32, params)

    out = []
    if d.kind == "llm_attention":
        m, h, hd = d.rows, d.hidden, d.head_dim
        qkv_n = (d.heads + 2 * d.kv_heads) * hd
        kv = kv_bucket(d.capacity, d.capacity)
        keys = kv if d.window is None else min(kv, round_up(d.window + m, KV_TILE))
        out += [("attn_norm", vec("rms_norm", m, h, 2), ("x", "attn_norm"), "T_norm"),
                ("qkv_proj", gemm(m, h, qkv_n, d.precision, group=d.group), ("T_norm", "w_qkv"), "T_qkv"),
                ("rope", vec("mul", m, qkv_n, 2), ("T_qkv", "rope_table"), "T_rope"),
                # flash attention over the cache (K/V tiles; no score row in one core's L1)
                ("attention", AttentionDesign(1, d.heads, d.kv_heads, m, keys, hd, causal=True,
                                              window=d.window or 0, softcap=d.softcap or 0.0,
                                              scale=d.scale, kv_tile=d.tkv, splits=d.splits),
                 ("T_q", "k_cache", "v_cache"), "T_attn"),
                ("o_proj", gemm(m, d.heads * hd, h, d.precision, group=d.group), ("T_attn", "w_o"), "out")]
    elif d.kind == "llm_mlp":
        m, h, f = d.rows, d.hidden, d.intermediate
        out += [("mlp_norm", vec("rms_norm", m, h, 2), ("x", "mlp_norm"), "T_norm"),
                ("gate_up", gemm(m, h, 2 * f, d.precision, group=d.group), ("T_norm", "w_gate_up"), "T_gu"),
                ("act", vec(d.act, m, f), ("T_g",), "T_act"),
                ("mul", vec("mul", m, f, 2), ("T_act", "T_u"), "T_h"),
                ("down", gemm(m, f, h, d.precision, group=d.group), ("T_h", "w_down"), "out")]
    elif d.kind == "llm_head":
        out += [("final_norm", vec("rms_norm", 1, d.hidden, 2), ("x", "final_norm"), "T_norm"),
                ("lm_head", gemm(1, d.hidden, d.vocab, d.precision, group=d.group), ("T_norm", "w_lm"), "logits")]
        if d.softcap:
            out.append(("softcap", vec("tanh", 1, d.vocab), ("logits",), "logits"))
    return out


def llm_block_programs(d, gen: Generation, **launch) -> tuple[ir.ArrayProgram, ...]:
    if d.kind == "llm_layer":
        try:                             # executable stages (kernels/stages/llm_layer.py)
            return layer_programs(d, gen, **launch)
        except LoweringError as e:
            why = str(e)
        return tuple(rename_args(p, {}, {"not_executable": why})
                     for p in llm_block_programs(d.attention, gen) + llm_block_programs(d.mlp, gen))
    why = ""
    if d.kind == "llm_head":
        try:                             # executable stages (kernels/stages/llm_head.py)
            return head_programs(d, gen, **launch)
        except LoweringError as e:
            why = str(e)
    progs = []
    for label, sd, ins, out in _stage_designs(d, gen):
        p = lower_stage(sd, gen)
        names = [a.name for a in p.sequence.args]
        mapping = dict(zip(names[:len(ins)], ins))
        mapping[names[-1]] = out
        scratch = tuple(sorted({n for n in (*ins, out) if n.startswith("T_")}))
        progs.append(rename_args(p, mapping, {"stage": f"{d.kind}.{label}", "scratch_args": scratch,
                                              "executable": False,
                                              **({"not_executable": why} if why else {})}))
    return tuple(progs)
