"""Mixture-of-experts blocks: the router on the array, then only the chosen experts' weights.

  MoeBlockDesign   norm + router GEMM + softmax + top-k + the chosen experts' gated MLPs,
                   weighted by their router probabilities, + residual
  MoeLayerDesign   attention block + MoE block as one launch (the "layer" layout)

Why this shape: a MoE model is large in total and small per token. Every expert stays resident
(system DRAM, which the NPU reads), and a token streams only the router and its top-k experts'
weights, so decode costs what a dense model of the *active* size costs. A prefill chunk groups
its rows by expert: each expert hit by any row of the chunk streams its weights once, for all
its rows (one GEMM of those rows), as transformers' expert loop groups them.

Numerics: the blocks' policy (toolkit.py): bf16 operands, fp32 accumulation, experts stored in
the MLP precision (bf16 / int8 / int4 / bfp16, groups along K per row, so an expert's rows of
the stacked weight are exactly that expert's quantized weight). The router weight stays bf16
(fp32 in the verification mode): it is small, and quantizing it would move the top-k choice.
Softmax, top-k and the renormalization run in fp32 on the vector unit; experts are summed in
ascending expert order, as transformers' Qwen3MoeExperts does.

gpt-oss (fields): the router has a bias and its softmax runs over the top-k logits
(`topk_first`), the experts have biases, and their activation is the clamped SwiGLU
(`limit` > 0): gate <= limit, -limit <= up <= limit, (up + 1) * gate * sigmoid(alpha gate), all
as transformers' GptOssExperts computes them (the loader reorders its interleaved gate/up
columns into gate rows then up rows). Experts in mxfp4 decode exactly to bf16 on the core;
`verify` runs the fp32 verification numerics over such exactly-decoded weights.

Plans charge exactly the bytes moved: the router, plus each hit expert's weight bytes once per
launch. Decode (one row) hits exactly top_k experts. A prefill launch's hit count depends on the
routing: the simulator charges the launch after its reference with the experts it actually chose
(`routed_plan`, read from the route output); plans from shapes alone (estimates, capacity
checks) take the expected count under uniform routing, E (1 - (1 - k/E)^rows), a stated
assumption.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.base import ceil_div
from torch_xdna.kernels.blocks.llm import DecoderBlockDesign, DecoderLayerDesign
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.blocks.toolkit import (
    HOST_GEMV_PRECISIONS, fused_plan, gemm_plan, inference_mode, linear, matmul, prologue,
    resident_operand, rms_norm, take_linear, vector_plan,
)
from torch_xdna.kernels.blocks.weights import weight_bytes, weight_tensors
from torch_xdna.kernels.host import gemv as host_gemv
from torch_xdna.runtime.plan import Plan


def expected_hits(experts: int, top_k: int, rows: int) -> int:
    """Distinct experts `rows` tokens choose, expected under uniform routing (at least top_k,
    at most every expert or rows * top_k)."""
    if rows <= 1:
        return top_k
    e = experts * (1.0 - (1.0 - top_k / experts) ** rows)
    return max(top_k, min(experts, rows * top_k, math.ceil(e - 1e-9)))


def expert_matmul(x: torch.Tensor, tensors, precision: str, group: int, rnd, start: int,
                  count: int) -> torch.Tensor:
    """x @ W[start:start+count]^T for the rows of one expert in a stacked resident weight, with
    toolkit.matmul's numerics (the host GEMV for a few rows when the host kernels are on)."""
    if (precision in HOST_GEMV_PRECISIONS and rnd is host_gemv.operand
            and host_gemv.fits(x.shape[0], tensors[0])):
        return host_gemv.bf16_linear(x, OPERANDS.bf16(tensors, precision, group).narrow(0, start, count))
    return linear(x, OPERANDS.get(tensors, precision, group).narrow(0, start, count), rnd, precision)


@dataclass(frozen=True)
class MoeBlockDesign(DecoderBlockDesign):
    """out[:n] = x + sum over e in topk(softmax(router(h))) of p_e * down_e(act(gate_e(h)) * up_e(h)),
    h = norm(x); p renormalized over the chosen experts when norm_topk.

    inputs: x [rows,H] fp32, mlp_norm [H], router [E,H] (bf16; fp32 in verification mode),
            (router_bias [E])?, *w_gate_up [E*2I, H] (expert-major: expert e's gate rows, then
            its up rows), (gate_up_bias [E*2I])?, *w_down [E*H, I], (down_bias [E*H])?
    outputs: out [rows,H] fp32 (may alias x), (route int32 [rows, top_k])? the chosen experts
    """

    experts: int
    top_k: int
    intermediate: int                  # per expert
    act: str = "silu"
    norm_topk: bool = False
    post_norm: bool = False            # (no MoE family has one; DecoderLayerDesign reads it)
    router_bias: bool = False
    expert_bias: bool = False
    topk_first: bool = False           # softmax over the top-k logits (else top-k of the softmax)
    limit: float = 0.0                 # > 0: the clamped SwiGLU (gpt-oss)
    alpha: float = 1.702
    verify: bool = False               # fp32 verification numerics (weights decode exactly)
    kind = "llm_moe"
    label = "moe"

    def route(self, h: torch.Tensor, router: torch.Tensor, rnd, exact: bool,
              bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities fp32 [n, k], expert ids [n, k]) of normed rows `h`; `router` is the
        resident weight as stored (`bias` its bias operand, gpt-oss)."""
        logits = matmul(h, (router,), "fp32" if exact else "bf16", 0, rnd)
        if bias is not None:
            logits = logits.add_(bias)
        if self.topk_first:
            top, ids = torch.topk(logits, self.top_k, dim=-1)
            return torch.softmax(top, dim=-1), ids
        probs = torch.softmax(logits, dim=-1)
        top, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            top = top / top.sum(dim=-1, keepdim=True)
        return top, ids

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n, exact, rnd, x, ln = prologue(self, inputs, n)
        nt = weight_tensors(self.precision)
        router = inputs[2]                             # stored bf16 (fp32 when exact)
        rb, i = (resident_operand(inputs[3], exact), 4) if self.router_bias else (None, 3)
        wgu, bgu, i = take_linear(inputs, i, nt, self.expert_bias, exact)
        wd, bd, _ = take_linear(inputs, i, nt, self.expert_bias, exact)
        xs = x if n == x.shape[0] else x[:n]
        h = rms_norm(xs, ln, self.eps, self.norm_offset, rnd)
        top, ids = self.route(h, router, rnd, exact, rb)
        if len(outputs) > 1:
            outputs[1][:n].copy_(ids.to(torch.int32))
        f, hd = self.intermediate, self.hidden
        acc = torch.zeros_like(xs)
        for e in torch.unique(ids).tolist():          # ascending: transformers' summation order
            rows, slot = (ids == e).nonzero(as_tuple=True)
            he = h if n == 1 else h.index_select(0, rows)
            gu = expert_matmul(he, wgu, self.precision, self.group, rnd, e * 2 * f, 2 * f)
            gu = rnd(gu if bgu is None else gu.add_(bgu.narrow(0, e * 2 * f, 2 * f)))
            a = self.activation(gu.narrow(1, 0, f), gu.narrow(1, f, f))
            y = expert_matmul(a, wd, self.precision, self.group, rnd, e * hd, hd)
            if bd is not None:
                y = y.add_(bd.narrow(0, e * hd, hd))
            acc.index_add_(0, rows, y * top[rows, slot].unsqueeze(1))
        out = outputs[0]
        (out if n == out.shape[0] else out[:n]).copy_(acc.add_(xs))

    def activation(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """act(gate) * up, or the clamped SwiGLU (limit > 0) in transformers' operation order."""
        if not self.limit:
            return apply_epilogue(self.act, gate) * up
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    # -- plans -------------------------------------------------------------------------------
    def expert_bytes(self) -> int:
        """One expert's weight bytes (gate, up and down, and their biases) as stored."""
        f, h = self.intermediate, self.hidden
        return (weight_bytes(2 * f, h, self.precision, self.group)
                + weight_bytes(h, f, self.precision, self.group)
                + (2 * f + h) * self.operand_bytes * self.expert_bias)

    @property
    def operand_bytes(self) -> int:
        """Bytes of a stored float operand (router, biases): bf16, fp32 when verifying."""
        return 4 if self.precision == "fp32" or self.verify else 2

    def router_bytes(self) -> int:
        return self.experts * (self.hidden + self.router_bias) * self.operand_bytes

    def plan(self, gen: Generation) -> Plan:
        """The plan at the expected hit count of a full launch; every expert GEMM is also
        checked at all `rows` rows (a chunk whose rows all chose one expert must plan)."""
        gemm_plan(gen, self.rows, self.hidden, 2 * self.intermediate, self.precision, group=self.group)
        return self.plan_hits(gen, expected_hits(self.experts, self.top_k, self.rows))

    def launch_plan(self, gen: Generation, n: int | None = None, **_: Any) -> Plan:
        """From shapes only: the expected hit count of `n` valid rows."""
        rows = self.rows if n is None else n
        return self.plan_hits(gen, expected_hits(self.experts, self.top_k, rows))

    def routed_plan(self, gen: Generation, outs, n: int | None = None, **_: Any) -> Plan:
        """After the reference: the experts this launch actually chose (its route output)."""
        if len(outs) < 2:
            return self.launch_plan(gen, n=n)
        return self.plan_hits(gen, self.hits(outs[1], n))

    def hits(self, route: torch.Tensor, n: int | None) -> int:
        rows = self.rows if n is None else n
        return int(torch.unique(route[:rows]).numel())

    def plan_hits(self, gen: Generation, hits: int) -> Plan:
        cache = self.__dict__.setdefault("_hit_plans", {})
        plan = cache.get((gen.name, hits))
        if plan is None:
            plan = cache[(gen.name, hits)] = self._plan_hits(gen, hits)
        return plan

    def _plan_hits(self, gen: Generation, hits: int) -> Plan:
        m, h, f, e, k = self.rows, self.hidden, self.intermediate, self.experts, self.top_k
        re = min(m, ceil_div(m * k, hits))              # rows per hit expert (grouped)
        router_p = "bf16"
        act = ([vector_plan(gen, "clamp", re, 2 * f), vector_plan(gen, "silu", re, f),
                vector_plan(gen, "add", re, f)] if self.limit else [vector_plan(gen, self.act, re, f)])
        expert = [gemm_plan(gen, re, h, 2 * f, self.precision, group=self.group),
                  *act, vector_plan(gen, "mul", re, f, 2),
                  gemm_plan(gen, re, f, h, self.precision, group=self.group),
                  vector_plan(gen, "mul", re, h, 2)]    # weighted by p, accumulated
        stages = ([vector_plan(gen, "rms_norm", m, h), gemm_plan(gen, m, h, e, router_p),
                   vector_plan(gen, "softmax", m, e)]
                  + [vector_plan(gen, "amax", m, e)] * k           # top-k: k max-and-mask passes
                  + expert * hits)
        w = self.router_bytes() + hits * self.expert_bytes()
        read = w + h * 2 + m * h * 4
        write = m * h * 4 + m * k * 4                    # rows out, the route ids
        return fused_plan(f"{self.name} rows={m} hits={hits}", self.kind, self.precision, gen,
                          stages, read, write, m, max(h, 2 * f),
                          {"weight_bytes": w, "experts_hit": hits,
                           "expert_bytes": hits * self.expert_bytes()})


@dataclass(frozen=True)
class MoeLayerDesign(DecoderLayerDesign):
    """One launch per MoE layer: the attention block then the MoE block (mlp) on the array.

    inputs: the attention block's inputs, then the MoE block's inputs without x
    outputs: out [rows,H], k_cache, v_cache (int8 KV: + k_scale, v_scale), (route [rows,k])?
    """

    kind = "llm_moe_layer"

    @property
    def n_kv_outputs(self) -> int:
        return 5 if self.attention.kv_dtype == "int8" else 3

    def reference(self, inputs, outputs, **scalars: Any) -> None:
        na, nk = self.n_attention_inputs, self.n_kv_outputs
        self.attention.reference(inputs[:na], outputs[:nk], **scalars)
        self.mlp.reference([outputs[0], *inputs[na:]], [outputs[0], *outputs[nk:nk + 1]], **scalars)

    def plan(self, gen: Generation) -> Plan:
        return self.combine(self.attention.plan(gen), self.mlp.plan(gen))

    def launch_plan(self, gen: Generation, **scalars: Any) -> Plan:
        return self._combined(gen, self.attention.launch_plan(gen, **scalars),
                              self.mlp.launch_plan(gen, **scalars))

    def routed_plan(self, gen: Generation, outs, **scalars: Any) -> Plan:
        nk = self.n_kv_outputs
        return self._combined(gen, self.attention.launch_plan(gen, **scalars),
                              self.mlp.routed_plan(gen, [outs[0], *outs[nk:nk + 1]], **scalars))

    def _combined(self, gen: Generation, a: Plan, m: Plan) -> Plan:
        cache = self.__dict__.setdefault("_moe_plans", {})
        key = (id(a), id(m))
        plan = cache.get(key)
        if plan is None:
            c = self.combine(a, m)
            notes = {**c.notes, **{k: m.notes[k] for k in ("experts_hit", "expert_bytes")}}
            plan = cache[key] = dataclasses.replace(c, notes=notes)
        return plan
