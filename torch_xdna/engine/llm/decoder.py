"""The fused decoder: resident weights, a device KV cache, and one Program per forward chunk.

Per token the engine runs ONE Program (one dispatch): embed, then one launch per layer (attention
block + MLP block in one design; layout "block" splits them into 2 launches), then the head.
Weights are uploaded once; activations, ids, logits and the KV cache are preallocated. A Program
is built once per (rows bucket, head) and reused. The position and valid-row count travel as
launch scalars in one shared dict, so the token loop neither re-plans nor allocates device
memory, and the decode Program stays one hardware context (the loop and the buffer ownership:
engine/kv_decoder.py, shared with Whisper's decoder).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

import torch

from torch_xdna.kernels.host import attention as host_attention

from torch_xdna.kernels.host import gemv as host_gemv
from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.blocks.llm import (
    AttentionBlockDesign, DecoderLayerDesign, EmbedDesign, HeadDesign, MlpBlockDesign,
    PosEmbedDesign,
)
from torch_xdna.kernels.blocks.linear_attn import DeltaNetBlockDesign, DeltaNetLayerDesign
from torch_xdna.kernels.blocks.moe import MoeBlockDesign, MoeLayerDesign
from torch_xdna.kernels.blocks.ple import PleEmbedDesign, PleLayerDesign
from torch_xdna.kernels.blocks.weights import EXACT_PRECISIONS, PRECISIONS, default_group, weight_bytes
from torch_xdna.kernels.ops.vector import VectorDesign
from torch_xdna.models.hf import ModelDirError
from torch_xdna.models.spec import DecoderSpec
from torch_xdna.runtime import Device, Launch, PlanError, Program, TensorArg, get_device
from torch_xdna.engine.kv_decoder import ResidentDecoder
from torch_xdna.engine.llm.kv_cache import KVCache, budget_capacity, kv_bytes_per_token

SITE_KINDS = ("attention", "mlp", "head")
DEFAULT_CHUNK = 128


class ContextOverflow(ValueError):
    """More tokens than the KV cache holds."""


@dataclass(frozen=True)
class PrecisionPolicy:
    """Weight precision per site kind (attention q/k/v/o, MLP, embedding + lm_head)."""

    attention: str = "bf16"
    mlp: str = "bf16"
    head: str = "bf16"
    group: int = 0                      # 0: the precision's default group size

    @classmethod
    def parse(cls, precision: "str | Mapping[str, str] | PrecisionPolicy", group: int = 0
              ) -> "PrecisionPolicy":
        """'int4' for every site, or {'default': 'int4', 'head': 'int8', ...}."""
        if isinstance(precision, PrecisionPolicy):
            return precision
        if isinstance(precision, str):
            kinds = dict.fromkeys(SITE_KINDS, precision)
        else:
            unknown = set(precision) - set(SITE_KINDS) - {"default"}
            if unknown:
                raise ValueError(f"unknown precision site(s) {sorted(unknown)}; use "
                                 f"{', '.join(SITE_KINDS)} or default")
            base = precision.get("default", "bf16")
            kinds = {k: precision.get(k, base) for k in SITE_KINDS}
        for k, p in kinds.items():
            if p not in PRECISIONS:
                raise ValueError(f"unknown precision {p!r} for {k}; use one of {', '.join(PRECISIONS)}")
        # fp32 (verification mode, set by the attention site) mixes only with MLP weights in a
        # format that decodes exactly (mxfp4 experts: their blocks run the verification
        # numerics); NPU precisions never with fp32
        if kinds["attention"] == "fp32":
            bad = kinds["head"] != "fp32" or kinds["mlp"] not in ("fp32",) + EXACT_PRECISIONS
        else:
            bad = "fp32" in kinds.values()
        if bad:
            raise ValueError("precision fp32 (verification mode) cannot be mixed with NPU precisions "
                             f"(fp32 attention and head take an fp32 or "
                             f"{'/'.join(EXACT_PRECISIONS)} mlp)")
        return cls(group=group, **kinds)

    @property
    def exact(self) -> bool:
        return self.attention == "fp32"

    def group_for(self, precision: str, *ks: int) -> int:
        """Group size of `precision` for a block whose weights have reduction sizes `ks`: the
        configured (or default) size, reduced to a common divisor of every K."""
        g = self.group or default_group(precision)
        for k in ks:
            g = math.gcd(g, k) if g else 0
        return g

    def block_group(self, spec: DecoderSpec, kind: str) -> int:
        """The one group size all weights of a fused block (attention, mlp, head) share."""
        lin = (spec.linear_v_heads * spec.linear_v_dim,) if spec.layer_kinds else ()
        layers = range(spec.layers)
        qs = tuple({spec.heads * spec.head_dim_at(i) for i in layers})
        ple = (spec.per_layer_dim,) if spec.per_layer_dim else ()
        ks = {"attention": (spec.hidden, spec.q_dim) + qs + lin,
              "mlp": (spec.hidden, spec.intermediate) + ((spec.expert_intermediate,)
                                                          if spec.experts else ())
              + tuple({spec.intermediate_at(i) for i in layers}) + ple,
              "head": (spec.hidden,) + ((spec.layers * spec.per_layer_dim,) if ple else ())}[kind]
        return self.group_for(getattr(self, kind), *ks)

    def ident(self) -> str:
        kinds = {self.attention, self.mlp, self.head}
        base = self.attention if len(kinds) == 1 else f"a{self.attention}-m{self.mlp}-h{self.head}"
        return base + (f"-g{self.group}" if self.group else "")

    def transform_for(self, spec: DecoderSpec):
        """Loader transform: matmul weights to their stored format, norms to bf16 (fp32)."""
        from torch_xdna.engine.llm.quantize import quantize
        kinds = {"qkv": "attention", "o": "attention", "lin_in": "attention",
                 "lin_out": "attention", "gate_up": "mlp", "down": "mlp",
                 "experts_gate_up": "mlp", "experts_down": "mlp", "embed": "head",
                 "lm_head": "head", "ple_gate": "mlp", "ple_out": "mlp", "ple_embed": "head",
                 "ple_proj": "head"}       # the MoE router stays bf16 (fp32), like the norms

        def transform(site: str, w) -> tuple[torch.Tensor, ...]:
            """w: the site's float tensor, or an MXFP4 checkpoint's stored (codes, scales)."""
            kind = kinds.get(site.rsplit(".", 1)[-1])
            if site.endswith((".lin_alog", ".lin_dt", ".lin_conv")):   # fp32 gate parameters
                return (w.to(torch.float32).contiguous(),)
            if kind is None:
                return (w.to(torch.float32 if self.exact else torch.bfloat16).contiguous(),)
            return quantize(w, getattr(self, kind), self.block_group(spec, kind))
        return transform


class ModelTooLarge(ModelDirError):
    """The model would not fit the device's memory budget (checked before any allocation)."""


def resident_bytes_estimate(spec: DecoderSpec, policy: PrecisionPolicy, capacity: int,
                            chunk: int = DEFAULT_CHUNK, kv_dtype: str = DEFAULT_KV_DTYPE) -> int:
    """Device bytes a Decoder of `spec` holds: weights in their stored formats, norms, RoPE
    tables, the KV cache at `capacity` and the activation/logit buffers. From shapes only, so
    an impossible config is refused before anything is read or allocated."""
    h = spec.hidden
    wb = weight_bytes
    ga, gm, gh = (policy.block_group(spec, k) for k in SITE_KINDS)
    norm = 4 if policy.exact else 2

    def attn(i: int) -> int:
        q = spec.heads * spec.head_dim_at(i)
        kv = 0 if spec.kv_shared(i) else 2 * spec.kv_heads_at(i) * spec.head_dim_at(i)
        return (wb(q * (2 if spec.attn_output_gate else 1) + kv, h, policy.attention, ga)
                + wb(h, q, policy.attention, ga) + 2 * spec.head_dim_at(i) * spec.qk_norm * norm
                + ((q + kv + h) * spec.qkvo_bias + spec.heads * spec.attention_sinks) * norm)
    vd, hv, c = spec.linear_v_heads * spec.linear_v_dim, spec.linear_v_heads, spec.linear_conv_dim
    lin = (wb(c + vd + 2 * hv, h, policy.attention, ga) + wb(h, vd, policy.attention, ga)
           + 4 * (c * spec.linear_conv + 2 * hv) + norm * spec.linear_v_dim
           + 4 * (hv * spec.linear_k_dim * spec.linear_v_dim + c * (spec.linear_conv - 1))
           ) if spec.layer_kinds else 0
    mixers = sum(lin if spec.is_linear(i) else attn(i) for i in range(spec.layers))

    def dense(i: int) -> int:
        fi = spec.intermediate_at(i)
        return wb((2 if spec.gated_mlp else 1) * fi, h, policy.mlp, gm) + wb(h, fi, policy.mlp, gm)
    fe = spec.expert_intermediate
    moe = spec.experts * ((h + spec.router_bias) * norm + wb(2 * fe, h, policy.mlp, gm)
                          + wb(h, fe, policy.mlp, gm)
                          + (2 * fe + h) * spec.expert_bias * norm) if spec.experts else 0
    mlps = sum(moe if spec.is_moe(i) else dense(i) for i in range(spec.layers))
    norms = (2 + 2 * spec.sandwich_norms) * h + spec.layer_scale
    head = wb(spec.vocab, h, policy.head, gh) * (1 if spec.tie_embeddings else 2)
    kv = capacity * per_token_bytes(spec, policy, kv_dtype)
    acts = chunk * h * 4 + chunk * 4 + spec.vocab * 4 + chunk * spec.experts_per_token * 4
    acts += spec.learned_positions * h * norm          # the learned position table
    p, lp = spec.per_layer_dim, spec.layers * spec.per_layer_dim
    ple = (wb(spec.per_layer_vocab, lp, policy.head, gh) + wb(lp, h, policy.head, gh)
           + spec.layers * (wb(p, h, policy.mlp, gm) + wb(h, p, policy.mlp, gm) + h * norm)
           + p * norm + chunk * lp * 4) if p else 0
    return spec.layers * norms * norm + mixers + mlps + h * norm + head + kv + acts + ple


def per_token_bytes(spec: DecoderSpec, policy: PrecisionPolicy, kv_dtype: str = DEFAULT_KV_DTYPE) -> int:
    """Device bytes one more context position costs: its KV entries and RoPE table rows."""
    if spec.per_layer_shapes:                 # layers of several shapes (Gemma 4)
        kv = sum(kv_bytes_per_token(1, spec.kv_heads_at(i), spec.head_dim_at(i), kv_dtype,
                                    policy.exact) for i in spec.cache_layers)
    else:
        kv = kv_bytes_per_token(len(spec.attention_layers), spec.kv_heads, spec.head_dim,
                                kv_dtype, policy.exact)
    return kv + sum(2 * spec.rope_dim(name) * 4 for name in spec.ropes)


def resolve_capacity(spec: DecoderSpec, policy: PrecisionPolicy, dev: Device,
                     max_context: int | None, chunk: int = DEFAULT_CHUNK,
                     kv_dtype: str = DEFAULT_KV_DTYPE) -> int:
    """KV capacity: max_context (capped at the model's maximum), else the memory-budget default
    (engine/llm/kv_cache.py's policy) from what the device has free after the weights."""
    if max_context:
        return int(min(max_context, spec.max_positions))
    free = dev.memory_budget - dev.counters.allocated_bytes
    fixed = resident_bytes_estimate(spec, policy, 0, chunk, kv_dtype)
    return budget_capacity(per_token_bytes(spec, policy, kv_dtype), free - fixed,
                           spec.max_positions)


def check_fits(spec: DecoderSpec, policy: PrecisionPolicy, capacity: int, dev: Device,
               chunk: int = DEFAULT_CHUNK, kv_dtype: str = DEFAULT_KV_DTYPE) -> int:
    """Raise ModelTooLarge when the model cannot fit what the device has free; returns bytes."""
    need = resident_bytes_estimate(spec, policy, capacity, chunk, kv_dtype)
    free = dev.memory_budget - dev.counters.allocated_bytes
    if need > free:
        per = per_token_bytes(spec, policy, kv_dtype)
        fixed = resident_bytes_estimate(spec, policy, 0, chunk, kv_dtype)
        most = max(0, (free - fixed) // per)
        tail = (f"{spec.family} with {spec.layers} layers, hidden {spec.hidden}, vocab "
                f"{spec.vocab} at precision {policy.ident()} and a {capacity}-token context "
                f"(KV cache {kv_dtype}, {per / 1024:.1f} KiB per token) needs "
                f"~{need / 2**30:.2f} GiB of NPU-reachable memory; {free / 2**30:.2f} GiB of the "
                f"{dev.memory_budget / 2**30:.2f} GiB budget (TORCH_XDNA_MEMORY_BUDGET) is free, "
                f"which holds at most {most} tokens of context. Use a smaller --max-context, "
                f"--kv-dtype int8, a smaller --precision (int8/int4), or raise "
                f"TORCH_XDNA_MEMORY_BUDGET")
        raise ModelTooLarge(f"config.json: {tail}", public=tail)
    return need


LAYOUTS = ("block", "layer")
# Default "layer": consecutive layers share one design, so no configure point between them
# (Qwen3: 2 per token, into the layers and into the head). "block" alternates two designs,
# 2 configure points per layer (modeled int4 decode at Qwen3-0.6B shapes, cost-v3: 1.37x the
# DRAM floor vs 1.10x, flash attention plan).
DEFAULT_LAYOUT = "layer"


def step_designs(spec: DecoderSpec, policy: PrecisionPolicy, rows: int, capacity: int,
                 with_head: bool, layout: str = DEFAULT_LAYOUT,
                 kv_dtype: str = DEFAULT_KV_DTYPE, images: bool = False
                 ) -> list[tuple[str, int, Design]]:
    """The launches of one forward chunk, in order: (role, layer, design). layout "layer": one
    launch per layer (default); "block": an attention-block and an MLP-block launch per layer.
    images: after the embedding, a select puts image rows in place of their placeholders
    (a select on the vector unit, exact in fp32: Decoder.forward_images)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if layout != "layer" and spec.per_layer_shapes:
        raise ValueError(f"layout {layout!r} is not implemented for {spec.family} (per-layer "
                         f"inputs and scalars run in the layer launch); use layout 'layer'")
    pa, pm, ph = policy.attention, policy.mlp, policy.head
    ga, gm, gh = (policy.block_group(spec, k) for k in SITE_KINDS)
    common = dict(hidden=spec.hidden, rows=rows, eps=spec.rms_eps, norm_offset=spec.norm_offset)
    embed = (PosEmbedDesign(spec.vocab, spec.hidden, rows, ph, gh, spec.embed_scale,
                            offset=spec.position_offset) if spec.learned_positions else
             PleEmbedDesign(spec.vocab, spec.hidden, rows, ph, gh, spec.embed_scale,
                            layers=spec.layers, ple_dim=spec.per_layer_dim, eps=spec.rms_eps)
             if spec.per_layer_dim else
             EmbedDesign(spec.vocab, spec.hidden, rows, ph, gh, spec.embed_scale))
    out: list[tuple[str, int, Design]] = [("embed", -1, embed)]
    if images:
        h = spec.hidden
        out.append(("image_rows", -1, VectorDesign(
            "where", ((rows, 1), (rows, h), (rows, h)), (torch.bool, torch.float32, torch.float32),
            (rows, h), torch.float32)))
    mlp = MlpBlockDesign(precision=pm, group=gm, intermediate=spec.intermediate,
                         act=spec.act, post_norm=spec.sandwich_norms, layer_norm=spec.layer_norm,
                         bias=spec.linear_bias, gated=spec.gated_mlp,
                         verify=policy.exact and pm != "fp32", **common)
    moe = MoeBlockDesign(precision=pm, group=gm, experts=spec.experts,
                         top_k=spec.experts_per_token, intermediate=spec.expert_intermediate,
                         act=spec.act, norm_topk=spec.norm_topk_prob, router_bias=spec.router_bias,
                         expert_bias=spec.expert_bias, topk_first=spec.router_topk_first,
                         limit=spec.swiglu_limit, alpha=spec.swiglu_alpha,
                         verify=policy.exact and pm != "fp32", **common) if spec.experts else None
    for i in range(spec.layers):
        if spec.is_linear(i):
            dn = DeltaNetBlockDesign(
                precision=pa, group=ga, k_heads=spec.linear_k_heads, v_heads=spec.linear_v_heads,
                k_dim=spec.linear_k_dim, v_dim=spec.linear_v_dim, conv=spec.linear_conv, **common)
            out += ([("layer", i, DeltaNetLayerDesign(dn, mlp))] if layout == "layer"
                    else [("linear", i, dn), ("mlp", i, mlp)])
            continue
        attn = AttentionBlockDesign(
            precision=pa, group=ga, heads=spec.heads, kv_heads=spec.kv_heads_at(i),
            head_dim=spec.head_dim_at(i), capacity=capacity, qk_norm=spec.qk_norm,
            post_norm=spec.sandwich_norms, window=spec.layer_window[i], scale=spec.attn_scale,
            softcap=spec.attn_softcap, cache_bytes=4 if policy.exact else 2, kv_dtype=kv_dtype,
            layer_norm=spec.layer_norm, bias=spec.qkvo_bias, rope=bool(spec.ropes),
            sinks=spec.attention_sinks,
            output_gate=spec.attn_output_gate, rotary_dim=spec.rotary_dim,
            v_norm=spec.v_norm, kv_shared=spec.kv_shared(i), **common)
        if spec.per_layer_shapes:         # Gemma 4: the layer's MLP width, PLE tail, scalar
            wide = replace(mlp, intermediate=spec.intermediate_at(i))
            out.append(("layer", i, PleLayerDesign(attn, wide, ple_dim=spec.per_layer_dim,
                                                   act=spec.act, scaled=spec.layer_scale)))
        elif spec.is_moe(i):
            out += ([("layer", i, MoeLayerDesign(attn, moe))] if layout == "layer"
                    else [("attention", i, attn), ("moe", i, moe)])
        elif layout == "layer":
            out.append(("layer", i, DecoderLayerDesign(attn, mlp)))
        else:
            out += [("attention", i, attn), ("mlp", i, mlp)]
    if with_head:
        out.append(("head", -1, HeadDesign(precision=ph, group=gh, vocab=spec.vocab,
                                           softcap=spec.final_softcap, layer_norm=spec.layer_norm,
                                           **common)))
    return out


def plan_chunk(spec: DecoderSpec, policy: PrecisionPolicy, capacity: int, requested: int,
               gen, layout: str = DEFAULT_LAYOUT, kv_dtype: str = DEFAULT_KV_DTYPE) -> int:
    """The prefill chunk: `requested` rows, halved until every launch of a chunk plans on `gen`
    at a full cache (mem-tile staging of the chunk's activations, attention tiles), so a long
    prompt never fails mid-prefill. Prefill memory is bounded by the chunk: activations are
    chunk x hidden, attention streams the cache in K/V tiles (no chunk x context score matrix)."""
    rows = max(1, int(requested))
    while True:
        try:
            designs = step_designs(spec, policy, rows, capacity, True, layout, kv_dtype)
            for d in dict.fromkeys(d for _, _, d in designs):     # equal layers plan once
                d.plan(gen)
            return rows
        except PlanError:
            if rows == 1:
                raise
            rows //= 2


class Decoder(ResidentDecoder):
    """Resident model + KV cache on one device; `forward(ids)` appends tokens, returns logits."""

    def __init__(self, spec: DecoderSpec, weights: dict[str, tuple[torch.Tensor, ...]],
                 policy: PrecisionPolicy, *, max_context: int | None = None,
                 prefill_chunk: int = DEFAULT_CHUNK, device: Device | None = None,
                 layout: str = DEFAULT_LAYOUT, kv_dtype: str = DEFAULT_KV_DTYPE):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
        super().__init__(device or get_device())
        self.spec, self.policy, self.layout, self.kv_dtype = spec, policy, layout, kv_dtype
        self.vocab = spec.vocab
        self.capacity = resolve_capacity(spec, policy, self.dev, max_context, int(prefill_chunk),
                                         kv_dtype)
        self.chunk = plan_chunk(spec, policy, self.capacity, prefill_chunk, self.dev.gen, layout,
                                kv_dtype)
        dev = self.dev
        try:
            self.w = {site: tuple(self.upload(t) for t in ts) for site, ts in weights.items()}
            if spec.tie_embeddings:
                self.w["lm_head"] = self.w["embed"]
            self.rope = {}
            for name, rope in spec.ropes.items():
                cos, sin = rope.tables(spec.rope_dim(name), self.capacity)
                self.rope[name] = (self.upload(cos), self.upload(sin))
            # KV only for the attention layers that own one (a KV-shared layer attends over its
            # source's); a linear-attention layer keeps its conv and recurrent states instead
            # (fp32, device-resident)
            owners = spec.cache_layers
            self.kv_index = {i: owners.index(spec.kv_owner(i)) for i in spec.attention_layers}
            self.states = {i: (self.empty((spec.linear_conv_dim, spec.linear_conv - 1), torch.float32),
                               self.empty((spec.linear_v_heads, spec.linear_k_dim, spec.linear_v_dim),
                                          torch.float32))
                           for i in range(spec.layers) if spec.is_linear(i)}
            self.cache = KVCache.allocate(dev, len(owners), [spec.kv_heads_at(i) for i in owners],
                                          [spec.head_dim_at(i) for i in owners], self.capacity,
                                          torch.float32 if policy.exact else torch.bfloat16,
                                          kv_dtype)
            self._owned += self.cache.buffers
            self.x = self.empty((self.chunk, spec.hidden), torch.float32)
            # per-layer inputs (PLE), written by the embedding launch, one buffer per layer
            self.ple = [self.empty((self.chunk, spec.per_layer_dim), torch.float32)
                        for _ in range(spec.layers if spec.per_layer_dim else 0)]
            self.ids = self.empty((self.chunk,), torch.int32)
            self.logits = self.empty((1, spec.vocab), torch.float32)
            # the experts each row of a chunk chose (written by the MoE blocks; the simulator
            # charges each MoE launch for exactly these experts' weights)
            self.route = (self.empty((self.chunk, spec.experts_per_token), torch.int32)
                          if spec.experts else None)
        except BaseException:
            self.close()
            raise
        if spec.vocab * spec.hidden >= host_gemv.MIN_WEIGHT:
            if host_gemv.available():  # build the decode host kernels now, not in the first token
                host_attention.available()

    # -- programs --------------------------------------------------------------------------
    def chunk_program(self, rows: int, last: bool) -> Program:
        return self.program(rows, last)        # only the last chunk runs the head

    def program(self, rows: int, with_head: bool, images: bool = False) -> Program:
        """The Program of a chunk of `rows` (bucketed) tokens; built once, reused every token.
        images: after the embedding, rows flagged in image_mask take image_x's rows (a chunk
        holding image soft tokens, forward_images)."""
        key = (rows, with_head) + (("images",) if images else ())
        prog = self._programs.get(key)
        if prog is not None:
            return prog
        spec, w, s = self.spec, self.w, self._scalars
        x = self.rows_view(self.x, rows)
        ids = self.rows_view(self.ids, rows)
        launches = []
        for role, i, design in step_designs(spec, self.policy, rows, self.capacity, with_head,
                                            self.layout, self.kv_dtype, images):
            if role == "embed":
                ple = [self.rows_view(a, rows) for a in self.ple]
                launches.append(Launch(design, self.embed_inputs(ids), [x, *ple], s, op="embed"))
            elif role == "image_rows":
                ins = [self.rows_view(self.image_mask, rows), self.rows_view(self.image_x, rows), x]
                launches.append(Launch(design, ins, [x], s, op="image_rows"))
            elif role == "head":
                launches.append(Launch(design, self.head_inputs(x), [self.logits], s, op="lm_head"))
            else:
                if spec.is_linear(i):          # outputs: rows, conv state, recurrent state
                    if role == "mlp":
                        ins, outs = self.mlp_inputs(x, i), [x]
                    else:
                        ins = self.linear_inputs(x, i) + (
                            self.mlp_inputs(x, i)[1:] if role == "layer" else [])
                        outs = [x, *self.states[i]]
                    launches.append(Launch(design, ins, outs, s, op=f"layer{i}.{role}"))
                    continue
                kv = [x, *self.cache.layer_outputs(self.kv_index[i])]
                route = [self.rows_view(self.route, rows)] if spec.is_moe(i) else []
                ins = {"attention": self.attention_inputs(x, i), "mlp": self.mlp_inputs(x, i),
                       "moe": self.mlp_inputs(x, i),
                       "layer": self.attention_inputs(x, i) + self.mlp_inputs(x, i)[1:]
                       + self.tail_inputs(i, rows)}[role]
                outs = {"attention": kv, "mlp": [x], "moe": [x, *route], "layer": kv + route}[role]
                launches.append(Launch(design, ins, outs, s, op=f"layer{i}.{role}"))
        prog = Program(launches, name=f"{spec.family}.{'decode' if rows == 1 else 'prefill'}")
        self._programs[key] = prog
        return prog

    def linear_inputs(self, x: TensorArg, i: int) -> list[TensorArg]:
        """Layer i's DeltaNet-block operands, in the design's order (activations `x` first)."""
        w, p = self.w, f"layers.{i}."
        return [x, *w[p + "attn_norm"], *w[p + "lin_in"], *w[p + "lin_conv"], *w[p + "lin_dt"],
                *w[p + "lin_alog"], *w[p + "lin_norm"], *w[p + "lin_out"]]

    def snapshot_state(self) -> list[torch.Tensor] | None:
        """Host copies of the recurrent states (linear attention), so several samples can start
        from one prefill; None when the model has none (rewinding the KV length suffices)."""
        if not self.states:
            return None
        return [self.dev.download(a).clone() for pair in self.states.values() for a in pair]

    def restore_state(self, snap: list[torch.Tensor] | None) -> None:
        if snap is None:
            return
        for a, t in zip((a for pair in self.states.values() for a in pair), snap):
            self.dev.write(a.buffer, t, a.offset)

    def embed_inputs(self, ids: TensorArg) -> list[TensorArg]:
        """The embedding launch's operands: the table, the ids (and the position table)."""
        pos = [*self.w["pos_embed"]] if self.spec.learned_positions else []
        ple = ([*self.w["ple_embed"], *self.w["ple_proj"], *self.w["ple_proj_norm"]]
               if self.spec.per_layer_dim else [])
        return [*self.w["embed"], ids, *pos, *ple]

    def head_inputs(self, x: TensorArg) -> list[TensorArg]:
        """The head launch's operands: rows, final norm (and its bias), lm_head."""
        bias = [*self.w["final_norm_bias"]] if self.spec.layer_norm else []
        return [x, *self.w["final_norm"], *bias, *self.w["lm_head"]]

    def attention_inputs(self, x: TensorArg, i: int) -> list[TensorArg]:
        """Layer i's attention-block operands, in the design's order (activations `x` first)."""
        spec, w, p = self.spec, self.w, f"layers.{i}."
        ins = [x, *w[p + "attn_norm"]]
        if spec.layer_norm:
            ins += [*w[p + "attn_norm_bias"]]
        if spec.qk_norm:
            ins += [*w[p + "q_norm"]] + ([] if spec.kv_shared(i) else [*w[p + "k_norm"]])
        ins += [*w[p + "qkv"]] + ([*w[p + "qkv_bias"]] if spec.qkvo_bias else [])
        ins += [*w[p + "o"]] + ([*w[p + "o_bias"]] if spec.qkvo_bias else [])
        ins += [*w[p + "sinks"]] if spec.attention_sinks else []
        if spec.sandwich_norms:
            ins += [*w[p + "attn_post_norm"]]
        return ins + (list(self.rope[spec.layer_rope[i]]) if spec.ropes else [])

    def mlp_inputs(self, x: TensorArg, i: int) -> list[TensorArg]:
        """Layer i's MLP-block operands, in the design's order (activations `x` first)."""
        spec, w, p = self.spec, self.w, f"layers.{i}."
        if spec.is_moe(i):
            rb = [*w[p + "router_bias"]] if spec.router_bias else []
            eb = spec.expert_bias
            return [x, *w[p + "mlp_norm"], *w[p + "router"], *rb, *w[p + "experts_gate_up"],
                    *(w[p + "experts_gate_up_bias"] if eb else ()), *w[p + "experts_down"],
                    *(w[p + "experts_down_bias"] if eb else ())]
        b = spec.linear_bias
        ins = [x, *w[p + "mlp_norm"]] + ([*w[p + "mlp_norm_bias"]] if spec.layer_norm else [])
        ins += [*w[p + "gate_up"]] + ([*w[p + "gate_up_bias"]] if b else [])
        ins += [*w[p + "down"]] + ([*w[p + "down_bias"]] if b else [])
        if spec.sandwich_norms:
            ins += [*w[p + "mlp_post_norm"]]
        return ins

    def tail_inputs(self, i: int, rows: int) -> list[TensorArg]:
        """Layer i's PLE-tail operands (Gemma 4): its per-layer rows, gate, projection and
        post norm, then its output scalar; none for other families."""
        spec, w, p = self.spec, self.w, f"layers.{i}."
        ins = ([self.rows_view(self.ple[i], rows), *w[p + "ple_gate"], *w[p + "ple_out"],
                *w[p + "ple_norm"]] if spec.per_layer_dim else [])
        return ins + ([*w[p + "layer_scalar"]] if spec.layer_scale else [])

    # -- execution -------------------------------------------------------------------------
    def context_error(self, total: int) -> ContextOverflow:
        return ContextOverflow(f"{total} tokens exceed the KV cache capacity of {self.capacity}; "
                               "pass a larger max_context or a shorter prompt")


def default_cache_dir() -> Path:
    """Quantized-weight cache: <cache root>/decoder-weights (runtime/cachedir.py's rules)."""
    from torch_xdna.runtime.cachedir import cache_root
    return cache_root() / "decoder-weights"


def estimate_step(spec: DecoderSpec, policy: PrecisionPolicy, cost, rows: int, pos: int, n: int,
                  capacity: int, with_head: bool, layout: str = DEFAULT_LAYOUT,
                  kv_dtype: str = DEFAULT_KV_DTYPE, memo: dict | None = None,
                  images: bool = False) -> dict:
    """Modeled cost of one forward chunk from plans only (no weights): the Program's launches
    charged through `cost` (a runtime.sim.cost.CostModel, whose state carries over between
    calls as the device's does) at the launch scalars pos/n, exactly as the sim charges them.
    memo: a dict kept across calls (same spec/policy/capacity) so equal designs are one object
    and their per-KV-extent launch plans are computed once (a 128K-token prefill: 1024 chunks)."""
    key = (rows, with_head, images)
    designs = None if memo is None else memo.get(key)
    if designs is None:
        canon: dict = {}
        designs = [canon.setdefault(d, d) for _, _, d in
                   step_designs(spec, policy, rows, capacity, with_head, layout, kv_dtype, images)]
        if memo is not None:
            memo[key] = designs
    plans = [d.launch_plan(cost.gen, pos=pos, n=n) if hasattr(d, "launch_plan") else d.plan(cost.gen)
             for d in designs]
    runs, cfg = cost.kernel_runs, cost.configure_points
    terms = cost.charge_program([(d.key, p, d.runs()) for d, p in zip(designs, plans)])
    out: dict = {"modeled_us": sum(t.total for t in terms), "launches": len(designs),
                 "dispatches": 1, "kernel_runs": cost.kernel_runs - runs,
                 "configure_points": cost.configure_points - cfg, "terms_us": {}}
    for t in terms:
        for name, v in t.as_dict().items():
            out["terms_us"][name] = out["terms_us"].get(name, 0.0) + v
    out["dram_bytes"] = sum(p.dram_read_bytes + p.dram_write_bytes for p in plans)
    out["weight_bytes"] = sum(p.notes.get("weight_bytes", 0) for p in plans)
    out["expert_bytes"] = sum(p.notes.get("expert_bytes", 0) for p in plans)
    out["kv_bytes"] = sum(p.notes.get("kv_read_bytes", 0) + p.notes.get("kv_write_bytes", 0)
                          for p in plans)
    return out
