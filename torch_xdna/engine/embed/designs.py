"""The designs an embedding model launches (every (batch, seq) bucket the Embedder runs), for
`xdna kernels build --model/--all-for`: what an encoder needs as hardware artifacts, from its
config alone. The decoders' counterpart is engine/llm/designs.py.

The fused encoder designs take their operands from the Embedder's bindings (Embedder._build):
`launch_operands` states them as (shape, dtype) pairs, the launch ABI their artifact manifest
records (kernels/toolchain/launch_abi.py)."""
from __future__ import annotations

import torch

from torch_xdna.engine.embed.embedder import MAX_BATCH, MAX_BATCH_TOKENS, bert_designs, \
    default_model_dir, launch_shapes, seq_buckets
from torch_xdna.kernels.toolchain.catalog import Example, Spec
from torch_xdna.models.encoder import EncoderSpec

F32, BF16, I32 = torch.float32, torch.bfloat16, torch.int32
DEFAULT_NAME = "all-MiniLM-L6-v2"      # `--all-for` name of the bundled default (`xdna embed`)


def launch_operands(sp: EncoderSpec, design) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """(inputs, outputs) of one launch of a fused encoder design, in Embedder._build's order
    (bf16 weights, GEMM weights [K, N])."""
    h, i = sp.hidden, sp.intermediate
    if design.kind == "encoder_embedding":
        b, s = design.batch, design.seq
        ins = (((sp.vocab, h), BF16), ((sp.max_position, h), BF16), ((design.type_vocab, h), BF16),
               ((h,), BF16), ((h,), BF16), ((b * s,), I32))
        return ins, (((b * s, h), F32),)
    if design.kind == "encoder_attention":
        b, s = design.batch, design.seq
        x = ((b * s, h), F32)
        return (x, ((h, 3 * h), BF16), ((3 * h,), BF16), ((b, s), F32), ((h, h), BF16),
                ((h,), BF16), ((h,), BF16), ((h,), BF16)), (x,)
    if design.kind == "encoder_ffn":
        r, s = design.rows, design.chunk
        x = ((r, h), F32)
        return (x, ((h, i), BF16), ((i,), BF16), ((i, h), BF16), ((h,), BF16), ((h,), BF16),
                ((h,), BF16), ((r // s, s), F32)), (x,)
    b, s = design.batch, design.seq                                    # encoder_pool
    return (((b * s, h), F32), ((b, s), F32)), (((b, h), F32),)


def model_designs(model: str, max_batch: int = MAX_BATCH) -> tuple[list[Example], list[str]] | None:
    """(buildable examples, "design: why not" for the rest), each distinct design once, for
    every (batch, seq) bucket an Embedder with `max_batch` sequences per launch runs; None when
    `model` is not an encoder (a directory, a built-in shape of engine/embed/estimate.py, or
    DEFAULT_NAME: the bundled default model)."""
    from torch_xdna.engine.embed.estimate import resolve
    if model.lower() == DEFAULT_NAME.lower():          # the bundled default embedding model
        model = str(default_model_dir())
    found = resolve(model)
    if found is None:
        return None
    name, _, sp = found
    if sp.arch is not None:
        return [], [f"{name}: a pre-norm encoder ({sp.arch}): its blocks have no stage lowering"]
    buckets = seq_buckets(min(sp.max_seq_length, sp.max_position))
    seen, examples = set(), []
    for b, s in launch_shapes(buckets, max_batch, MAX_BATCH_TOKENS):
        for d in bert_designs(sp, b, s):
            if d.key in seen:
                continue
            seen.add(d.key)
            ins, outs = launch_operands(sp, d)
            examples.append(Example(d, ins, outs))
    return examples, []
