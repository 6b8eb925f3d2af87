"""Gemma 4's per-layer inputs (PLE) and per-layer output scalar, as two fused designs.

  PleEmbedDesign  the embedding launch that also computes every layer's input row of width P:
                  (rmsnorm(embeds @ W_proj^T / sqrt(H)) + ple_table[ids] * sqrt(P)) / sqrt(2),
                  written as one [rows, P] buffer per layer (transformers'
                  get_per_layer_inputs + project_per_layer_inputs)
  PleLayerDesign  attention block + MLP block + the PLE tail, one launch per layer:
                  x += post_norm(proj(act(gate(x)) * ple_i)); x *= layer_scalar

Why a launch does it: the per-layer inputs depend on the token only, so one GEMM at the
embedding serves every layer, and each layer's tail is two thin GEMMs (P = 256 at E2B) and
vector passes on rows already on chip: no extra launch, no extra configure point per token.

Numerics: the blocks' policy (toolkit.py): bf16 operands, fp32 accumulation; the PLE table and
its projection are stored in the head precision (like the embedding), the tail's gate and
projection in the MLP precision; norms plain-w RMSNorm (Gemma 4). "fp32" is the verification
mode (nothing rounded). Plans charge every weight byte once per launch, the gathered PLE table
rows and the per-layer rows in and out (fp32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.blocks.llm import DecoderLayerDesign, EmbedDesign
from torch_xdna.kernels.blocks.toolkit import (
    combine_plans, fused_plan, gemm_plan, inference_mode, matmul, operand_rounding,
    resident_operand, rms_norm, take_inputs, vector_plan,
)
from torch_xdna.kernels.blocks.weights import dequantize, weight_bytes, weight_tensors
from torch_xdna.runtime.plan import Plan

TAIL_STAGES = ("ple_gate", "ple_act", "ple_mul", "ple_proj", "ple_norm", "layer_scale")


@dataclass(frozen=True)
class PleEmbedDesign(EmbedDesign):
    """x[:n] = table[ids] * scale, and ple_l[:n] for every layer l (module docstring).

    inputs: *table, ids int32 [rows], *ple_table [V_ple, L*P], *ple_proj [L*P, H], ple_norm [P]
    outputs: x [rows, H] fp32, then L buffers [rows, P] fp32
    """

    layers: int = 0
    ple_dim: int = 0
    eps: float = 1e-6
    kind = "llm_ple_embed"

    @property
    def name(self) -> str:
        return f"{self.family}.ple_embed[{self.precision}]"

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n = self.rows if n is None else n
        nt = weight_tensors(self.precision)
        super().reference(inputs[:nt + 1], outputs[:1], pos=pos, n=n)
        exact = self.precision == "fp32"
        rnd = operand_rounding(exact)
        ids = inputs[nt][:n].long()
        table, i = take_inputs(inputs, nt + 1, nt)
        proj_w, i = take_inputs(inputs, i, nt)
        norm = resident_operand(inputs[i], exact)
        lp, p = self.layers * self.ple_dim, self.ple_dim
        x = outputs[0][:n]
        proj = matmul(x, proj_w, self.precision, self.group, rnd) * self.hidden ** -0.5
        proj = rms_norm(proj.view(n, self.layers, p), norm, self.eps, 0.0, rnd)
        tok = dequantize([t[ids] for t in table], self.precision, self.group).view(n, lp)
        tok = rnd(tok) * rnd(torch.tensor(p ** 0.5))
        both = (proj + tok.view(n, self.layers, p)) * 2 ** -0.5
        for layer, out in enumerate(outputs[1:1 + self.layers]):
            out[:n].copy_(both[:, layer])

    def plan(self, gen: Generation) -> Plan:
        m, h, lp = self.rows, self.hidden, self.layers * self.ple_dim
        row = (weight_bytes(1, h, self.precision, self.group)
               + weight_bytes(1, lp, self.precision, self.group))
        w = weight_bytes(lp, h, self.precision, self.group)
        stages = [gemm_plan(gen, m, h, lp, self.precision, group=self.group),
                  vector_plan(gen, "rms_norm", m * self.layers, self.ple_dim),
                  vector_plan(gen, "add", m, lp, 2)]
        read = m * (row + 4) + w + self.ple_dim * 2
        write = m * (h + lp) * 4
        return fused_plan(f"{self.name} rows={m}", self.kind, self.precision, gen, stages, read,
                          write, m, max(h, lp), {"weight_bytes": w})


@dataclass(frozen=True)
class PleLayerDesign(DecoderLayerDesign):
    """One launch per Gemma 4 layer: attention, MLP, then the PLE tail and the layer scalar.

    inputs: the attention block's, the MLP block's without x, then (ple_dim > 0) the layer's
            per-layer rows [rows, P], *w_gate [P, H], *w_proj [H, P], post_norm [H]; then
            (scaled) the layer scalar [1]
    outputs: out [rows,H], k_cache, v_cache (the layer's own, or the one it shares)
    """

    ple_dim: int = 0
    act: str = "gelu_tanh"
    scaled: bool = True
    kind = "llm_ple_layer"

    @property
    def n_mlp_inputs(self) -> int:
        m = self.mlp
        return (1 + m.layer_norm + 2 * weight_tensors(m.precision) + 2 * m.bias
                + (1 if m.post_norm else 0))

    def reference(self, inputs, outputs, **scalars: Any) -> None:
        na = self.n_attention_inputs
        nm = na + self.n_mlp_inputs
        self.attention.reference(inputs[:na], outputs, **scalars)
        self.mlp.reference([outputs[0], *inputs[na:nm]], [outputs[0]], **scalars)
        self.tail(inputs[nm:], outputs[0], scalars.get("n"))

    @inference_mode
    def tail(self, inputs, out: torch.Tensor, n: int | None) -> None:
        """x += post_norm(proj(act(gate(x)) * ple)); x *= scalar, on the first n rows."""
        m = self.mlp
        n = m.rows if n is None else n
        exact = m.precision == "fp32"
        rnd = operand_rounding(exact)
        x = out[:n]
        i = 0
        if self.ple_dim:
            nt = weight_tensors(m.precision)
            ple = inputs[0][:n]
            wg, i = take_inputs(inputs, 1, nt)
            wo, i = take_inputs(inputs, i, nt)
            g = apply_epilogue(self.act, matmul(x, wg, m.precision, m.group, rnd)) * ple
            y = rms_norm(matmul(g, wo, m.precision, m.group, rnd),
                         resident_operand(inputs[i], exact), m.eps, m.norm_offset, rnd)
            x.add_(y)
            i += 1
        if self.scaled:
            x.mul_(resident_operand(inputs[i], exact))

    def runs(self) -> tuple:
        stages = TAIL_STAGES if self.ple_dim else TAIL_STAGES[-1:]
        return (self.attention.runs() + self.mlp.runs()
                + tuple((self.key, s) for s in stages))

    def tail_plan(self, gen: Generation) -> Plan:
        """The tail's plan: its weights and the layer's per-layer rows are its only traffic
        (x is on chip from the MLP block)."""
        cache = self.__dict__.setdefault("_tail_plans", {})
        if gen.name in cache:
            return cache[gen.name]
        m, h, p, prec, g = self.mlp.rows, self.mlp.hidden, self.ple_dim, self.mlp.precision, self.mlp.group
        stages = [vector_plan(gen, "mul", m, h, 2)]
        w = 0
        if p:
            stages = [gemm_plan(gen, m, h, p, prec, group=g), vector_plan(gen, self.act, m, p),
                      vector_plan(gen, "mul", m, p, 2), gemm_plan(gen, m, p, h, prec, group=g),
                      vector_plan(gen, "rms_norm", m, h)] + stages
            w = weight_bytes(p, h, prec, g) + weight_bytes(h, p, prec, g)
        read = w + (h * (p > 0) + self.scaled) * 2 + m * p * 4
        cache[gen.name] = fused_plan(f"llm.ple_tail[{prec}] rows={m}", "llm_ple_tail", prec, gen,
                                     stages, read, 0, m, h, {"weight_bytes": w})
        return cache[gen.name]

    def plan(self, gen: Generation) -> Plan:
        return self.with_tail(gen, super().plan(gen))

    def launch_plan(self, gen: Generation, **scalars: Any) -> Plan:
        base = super().launch_plan(gen, **scalars)      # memoized per KV extent by the base
        cache = self.__dict__.setdefault("_tail_launch_plans", {})
        if id(base) not in cache:
            cache[id(base)] = self.with_tail(gen, base)
        return cache[id(base)]

    def with_tail(self, gen: Generation, base: Plan) -> Plan:
        """The attention + MLP plan `base` followed by the tail on the same rows."""
        t = self.tail_plan(gen)
        keys = ("weight_bytes", "fill_s", "stream_bytes")
        return combine_plans(
            self.kind, (base, t), double_buffered=True, dma_shapes=(),
            dram_read_bytes=base.dram_read_bytes + t.dram_read_bytes,
            dram_write_bytes=base.dram_write_bytes,
            notes={**base.notes, **{k: base.notes.get(k, 0) + t.notes.get(k, 0) for k in keys}})
