"""Gated DeltaNet (linear attention) blocks of hybrid decoders (Qwen3.5): a recurrent state per
layer instead of a KV cache, so a long context costs only the full-attention layers' KV.

  DeltaNetBlockDesign  norm + fused input projection (q k v | z | b | a) + causal depthwise conv
                       (with its state) + SiLU + L2-normed q, k + the gated delta rule over the
                       device-resident state + gated RMSNorm (silu(z)) + out_proj + residual
  DeltaNetLayerDesign  that block + the MLP block as one launch (the "layer" layout)

The delta rule, per value head (state S [Dk, Dv], decay g <= 0, beta in (0, 1)):
    S <- S * exp(g_t);  S <- S + k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
Decode rows run that recurrence (the recurrent form); a prefill chunk runs the chunked form
(transformers' torch_chunk_gated_delta_rule: 64-token sub-chunks, intra-chunk matrices and a
triangular solve, the state carried between sub-chunks), starting from the stored state, so
a prompt split into any prefill chunks gives the same result up to fp32 rounding.

Numerics: projections with the blocks' policy (bf16 operands, fp32 accumulation, rounded to
operands once); conv, gates, normalizations and the state in fp32 on the vector unit / mem
tiles (the fp32 verification mode rounds nothing). States: conv [C, K-1] and S [Hv, Dk, Dv],
fp32, device-resident outputs of the launch; at position 0 they are taken as zero.

Plan: the weights once per launch; the state read and written once per launch (fp32); the
matrix work of the delta rule charged as batched GEMMs of rows x Dk x Dv per value head (4 for
the chunked form, 3 vector passes for one decode row), which is the modeled assumption.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from torch_xdna.hw import Generation
from torch_xdna.kernels.blocks.llm import DecoderBlockDesign, DecoderLayerDesign
from torch_xdna.kernels.blocks.toolkit import (
    fused_plan, gemm_plan, inference_mode, matmul, prologue, resident_operand, rms_norm,
    take_inputs, vector_plan,
)
from torch_xdna.kernels.blocks.weights import weight_bytes, weight_tensors
from torch_xdna.runtime.plan import Plan

DELTA_CHUNK = 64            # the chunked form's sub-chunk (transformers' default chunk_size)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_recurrent(q, k, v, g, beta, state):
    """The recurrent form over T rows: q, k [H, T, Dk], v [H, T, Dv], g, beta [H, T], state
    [H, Dk, Dv] (updated in place) -> o [H, T, Dv]."""
    out = torch.empty_like(v)
    for t in range(q.shape[1]):
        state.mul_(g[:, t].exp()[:, None, None])
        mem = (state * k[:, t, :, None]).sum(-2)
        delta = (v[:, t] - mem) * beta[:, t, None]
        state.add_(k[:, t, :, None] * delta[:, None, :])
        out[:, t] = (state * q[:, t, :, None]).sum(-2)
    return out


def delta_chunked(q, k, v, g, beta, state, chunk: int = DELTA_CHUNK):
    """The chunked form (transformers' torch_chunk_gated_delta_rule, the same operations), from
    `state` [H, Dk, Dv] (updated in place) -> o [H, T, Dv]."""
    h, t, dv = v.shape
    pad = (chunk - t % chunk) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    n = (t + pad) // chunk
    vb, kb = v * beta[..., None], k * beta[..., None]
    q, k, kb, vb = (x.reshape(h, n, chunk, x.shape[-1]) for x in (q, k, kb, vb))
    g = g.reshape(h, n, chunk).cumsum(-1)
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()
    system = (kb @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    new_v = torch.linalg.solve_triangular(system, vb, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(system, kb * g.exp()[..., None], upper=False,
                                          unitriangular=True)
    q = q * g.exp()[..., None]
    k = k * (g[..., -1:] - g).exp()[..., None]
    step = g[..., -1].exp()[..., None, None]
    out = torch.empty_like(new_v)
    for i in range(n):
        vn = new_v[:, i] - k_cum[:, i] @ state
        out[:, i] = q[:, i] @ state + intra[:, i] @ vn
        state.copy_(state * step[:, i] + k[:, i].transpose(-1, -2) @ vn)
    return out.reshape(h, -1, dv)[:, :t]


@dataclass(frozen=True)
class DeltaNetBlockDesign(DecoderBlockDesign):
    """out[:n] = x + out_proj(gated_norm(delta_rule(conv(in_proj(norm(x)))), z)).

    inputs: x [rows,H], attn_norm [H], *w_in [C + Vd + 2Hv, H] (q k v | z | b | a),
            conv [C, K], dt_bias [Hv], a_log [Hv] (fp32), norm [Dv], *w_out [H, Vd]
    outputs: out [rows,H] (may alias x), conv_state [C, K-1] fp32, state [Hv, Dk, Dv] fp32
    scalars: pos (0: the states start from zero), n (valid rows)
    """

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv: int
    kind = "llm_deltanet"
    label = "deltanet"

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @inference_mode
    def reference(self, inputs, outputs, pos: int = 0, n: int | None = None, **_: Any) -> None:
        n, exact, rnd, x, ln = prologue(self, inputs, n)
        nt = weight_tensors(self.precision)
        w_in, i = take_inputs(inputs, 2, nt)
        conv_w, dt, a_log = inputs[i].float(), inputs[i + 1].float(), inputs[i + 2].float()
        gnorm = resident_operand(inputs[i + 3], exact)
        w_out, _ = take_inputs(inputs, i + 4, nt)
        out, conv_state, state = outputs[:3]
        if pos == 0:                                   # a new sequence: zero states
            conv_state.zero_()
            state.zero_()
        xs = x if n == x.shape[0] else x[:n]
        h = rms_norm(xs, ln, self.eps, self.norm_offset, rnd)
        proj = rnd(matmul(h, w_in, self.precision, self.group, rnd))
        c, hk, hv, dk, dv = self.conv_dim, self.k_heads, self.v_heads, self.k_dim, self.v_dim
        mixed, z = proj[:, :c], proj[:, c:c + hv * dv]
        b, a = proj[:, c + hv * dv:c + hv * dv + hv], proj[:, c + hv * dv + hv:]
        seq = torch.cat([conv_state.t(), mixed])                 # [K-1+n, C]
        conv_state.copy_(seq[-(self.conv - 1):].t())
        mixed = F.silu(F.conv1d(seq.t().unsqueeze(0), conv_w.unsqueeze(1), groups=c)[0].t())
        q = mixed[:, :hk * dk].reshape(n, hk, dk).transpose(0, 1)
        k = mixed[:, hk * dk:2 * hk * dk].reshape(n, hk, dk).transpose(0, 1)
        v = mixed[:, 2 * hk * dk:].reshape(n, hv, dv).transpose(0, 1)
        if hv != hk:
            q, k = (t.repeat_interleave(hv // hk, dim=0) for t in (q, k))
        q, k = l2norm(q) * dk ** -0.5, l2norm(k)
        beta = torch.sigmoid(b).t()
        g = (-a_log.exp()[:, None] * F.softplus(a.t() + dt[:, None]))
        form = delta_recurrent if n == 1 else delta_chunked
        o = form(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, state)
        o = rms_norm(o.transpose(0, 1), gnorm, self.eps, 0.0, rnd) * F.silu(z.reshape(n, hv, dv))
        y = matmul(o.reshape(n, hv * dv), w_out, self.precision, self.group, rnd)
        (out if n == out.shape[0] else out[:n]).copy_(y.add_(xs))

    def plan(self, gen: Generation) -> Plan:
        m, h = self.rows, self.hidden
        hv, dk, dv, c = self.v_heads, self.k_dim, self.v_dim, self.conv_dim
        n_in = c + hv * dv + 2 * hv
        rule = ([gemm_plan(gen, m, dk, dv, "bf16", batch=hv)] * 4 if m > 1 else
                [vector_plan(gen, "mul", hv * dk, dv, 2)] * 3)
        stages = ([vector_plan(gen, "rms_norm", m, h),
                   gemm_plan(gen, m, h, n_in, self.precision, group=self.group),
                   vector_plan(gen, "mul", m, c * self.conv, 2), vector_plan(gen, "silu", m, c)]
                  + rule + [vector_plan(gen, "rms_norm", m * hv, dv), vector_plan(gen, "silu", m, hv * dv),
                            gemm_plan(gen, m, hv * dv, h, self.precision, group=self.group)])
        w = (weight_bytes(n_in, h, self.precision, self.group)
             + weight_bytes(h, hv * dv, self.precision, self.group))
        states = 4 * (hv * dk * dv + c * (self.conv - 1))
        small = 2 * (h + c * self.conv + dv) + 8 * hv
        return fused_plan(f"{self.name} rows={m}", self.kind, self.precision, gen, stages,
                          w + small + states + m * h * 4, states + m * h * 4, m, max(h, n_in),
                          {"weight_bytes": w, "state_bytes": 2 * states})


@dataclass(frozen=True)
class DeltaNetLayerDesign(DecoderLayerDesign):
    """One launch per linear-attention layer: the DeltaNet block (attention) then the MLP block.

    inputs: the DeltaNet block's inputs, then the MLP block's without x
    outputs: out [rows,H], conv_state, state
    """

    kind = "llm_deltanet_layer"

    @property
    def n_attention_inputs(self) -> int:
        return 2 + 2 * weight_tensors(self.attention.precision) + 4

    def reference(self, inputs, outputs, **scalars: Any) -> None:
        na = self.n_attention_inputs
        self.attention.reference(inputs[:na], outputs, **scalars)
        self.mlp.reference([outputs[0], *inputs[na:]], [outputs[0]], **scalars)

    def launch_plan(self, gen: Generation, **_: Any) -> Plan:
        cache = self.__dict__.setdefault("_layer_plans", {})
        if gen.name not in cache:
            cache[gen.name] = self.plan(gen)
        return cache[gen.name]
