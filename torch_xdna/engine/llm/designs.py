"""The designs a decoder launches (prefill chunks and decode steps), for `xdna kernels build
--model/--all-for`: what a model needs as hardware artifacts, from its config alone.

Plain designs (GEMMs, vector ops) take their operands from their parameters
(toolchain/catalog.example_for); the fused engine designs take them from the engine's bindings
(Decoder.program), which `launch_operands` states as (shape, dtype) pairs: the launch ABI their
artifact manifest records (kernels/toolchain/launch_abi.py)."""
from __future__ import annotations

import torch

from torch_xdna.engine.llm.decoder import DEFAULT_CHUNK, DEFAULT_LAYOUT, PrecisionPolicy, step_designs
from torch_xdna.engine.llm.estimate import resolve_spec
from torch_xdna.hw import Generation
from torch_xdna.kernels.toolchain.catalog import Example, Spec, example_for
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.models.spec import DecoderSpec

F32, BF16, I32 = torch.float32, torch.bfloat16, torch.int32


def weight_specs(n: int, k: int, precision: str, group: int) -> tuple[Spec, ...]:
    """The stored tensors of an [N, K] weight (engine/llm/quantize.py's formats)."""
    if precision in ("fp32", "bf16"):
        return (((n, k), F32 if precision == "fp32" else BF16),)
    if precision == "bfp16":
        return (((n, k // 8 * 9), torch.uint8),)
    q = ((n, k), torch.int8) if precision == "int8" else ((n, k // 2), torch.uint8)
    return (q, ((n, k // group), BF16))


def launch_operands(spec: DecoderSpec, policy: PrecisionPolicy, role: str, design,
                    capacity: int, kv_dtype: str = "bf16") -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """(inputs, outputs) of one launch of a fused decoder design, in Decoder.program's order."""
    h, d = spec.hidden, spec.head_dim
    rows = getattr(design, "rows", None) or design.attention.rows   # a layer: its blocks' rows
    norm = F32 if policy.exact else BF16
    ga, gm, gh = (policy.block_group(spec, k) for k in ("attention", "mlp", "head"))
    x = ((rows, h), F32)
    if role == "embed":
        return weight_specs(spec.vocab, h, policy.head, gh) + (((rows,), I32),), (x,)
    if role == "head":
        return (x, ((h,), norm), *weight_specs(spec.vocab, h, policy.head, gh)), (((1, spec.vocab), F32),)
    attn = [x, ((h,), norm)]
    if spec.qk_norm:
        attn += [((d,), norm), ((d,), norm)]
    attn += [*weight_specs(spec.q_dim + 2 * spec.kv_dim, h, policy.attention, ga),
             *weight_specs(h, spec.q_dim, policy.attention, ga)]
    if spec.sandwich_norms:
        attn.append(((h,), norm))
    attn += [((capacity, d), F32), ((capacity, d), F32)]
    mlp = [((h,), norm), *weight_specs(2 * spec.intermediate, h, policy.mlp, gm),
           *weight_specs(h, spec.intermediate, policy.mlp, gm)]
    if spec.sandwich_norms:
        mlp.append(((h,), norm))
    cache = ((spec.kv_heads, capacity, d), torch.int8 if kv_dtype == "int8" else norm)
    kv = [cache, cache] + ([((spec.kv_heads, capacity), F32)] * 2 if kv_dtype == "int8" else [])
    if role == "attention":
        return tuple(attn), (x, *kv)
    if role == "mlp":
        return (x, *mlp), (x,)
    return tuple(attn + mlp), (x, *kv)                   # "layer"


def model_designs(model: str, precision: str, gen: Generation, context: int = 4096,
                  chunk: int = DEFAULT_CHUNK) -> tuple[list[Example], list[str]]:
    """(buildable examples, "design: why not" for the rest), each distinct design once, for an
    engine with KV capacity min(context, the model's maximum) and prefill chunk `chunk` (what
    `load_decoder(max_context=..., prefill_chunk=...)` launches: the artifact keys follow)."""
    _, spec = resolve_spec(model)
    policy = PrecisionPolicy.parse(precision, 0)
    cap = max(min(spec.max_positions, context), 2)
    seen, examples, skipped = set(), [], []
    # every rows bucket a launch may take: prefill chunks of 1, 2, 4, ... up to the chunk
    # (rows_bucket: a prompt's last partial chunk runs at the next power of two), decode at 1
    buckets = sorted({rows_bucket(1 << k, chunk) for k in range(chunk.bit_length())},
                     reverse=True)
    for rows in buckets:
        for role, _layer, d in step_designs(spec, policy, rows, cap, True, DEFAULT_LAYOUT):
            if d.key in seen:
                continue
            seen.add(d.key)
            ex = example_for(d)
            if ex is None and spec.per_layer_shapes:
                skipped.append(f"{d.name}: {spec.family}'s fused designs (per-layer shapes, "
                               "shared KV, per-layer inputs) have no launch ABI here yet")
                continue
            if ex is None:
                ins, outs = launch_operands(spec, policy, role, d, cap)
                ex = Example(d, ins, outs)
            examples.append(ex)
    return examples, skipped
