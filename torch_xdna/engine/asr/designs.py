"""The designs a Whisper model launches (the encoder Program per window; the decoder's embed,
layers and head per rows bucket), for `xdna kernels build --model/--all-for`: what it needs as
hardware artifacts, from its config alone. The decoders' counterpart is engine/llm/designs.py.

The fused Whisper designs take their operands from WhisperModel's bindings
(engine/asr/whisper.py: encoder_program, program); `launch_operands` states them as (shape,
dtype) pairs, the launch ABI their artifact manifest records (kernels/toolchain/launch_abi.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from torch_xdna.engine.asr.whisper import DEFAULT_CHUNK
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.kernels.blocks.whisper import encoder_designs, split_precision, step_designs
from torch_xdna.kernels.stages.whisper import cache_rows, cross_rows
from torch_xdna.kernels.toolchain.catalog import Example, Spec
from torch_xdna.models.speech.whisper import WhisperSpec

F32, BF16, I32 = torch.float32, torch.bfloat16, torch.int32


def is_whisper(model: str) -> bool:
    """`model` is a Whisper directory (config.json model_type "whisper")."""
    cfg = Path(model).expanduser() / "config.json"
    try:
        return json.loads(cfg.read_text()).get("model_type") == "whisper"
    except (OSError, ValueError):
        return False


def launch_operands(spec: WhisperSpec, design, precision: str = "bf16"
                    ) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """(inputs, outputs) of one launch of a Whisper design, in WhisperModel's order (weights in
    the stored precision: bf16, or fp32 in the verification mode)."""
    wt = F32 if split_precision(precision)[0] == "fp32" else BF16
    h, s, nh = spec.d_model, spec.source_positions, spec.decoder_heads
    d = h // nh
    vec = ((h,), wt)

    def lin(n: int, k: int) -> tuple[Spec, Spec]:
        return ((n, k), wt), ((n,), wt)

    heads = ((nh, cross_rows(s), d), wt)
    kind = design.kind
    if kind == "whisper_stem":
        m, f = spec.n_mels, spec.mel_frames
        return (((m, f), F32), ((h, m, 3), wt), vec, ((h, h, 3), wt), vec, ((s, h), wt)), \
            (((s, h), F32),)
    if kind == "whisper_encoder_layer":
        x, ff = ((s, h), F32), spec.encoder_ffn
        return (x, vec, vec, *lin(3 * h, h), *lin(h, h), vec, vec, *lin(ff, h), *lin(h, ff)), (x,)
    if kind == "whisper_cross_kv":
        x = ((s, h), F32)
        ins = (x, vec, vec) if design.final_norm else (x,)
        return ins + lin(2 * h, h), (x, heads, heads)
    rows = design.rows
    x = ((rows, h), F32)
    if kind == "whisper_embed":
        return (((spec.vocab, h), wt), ((spec.target_positions, h), wt), ((rows,), I32)), (x,)
    if kind == "whisper_head":
        return (x, vec, vec, ((spec.vocab, h), wt)), (((1, spec.vocab), F32),)
    cache = ((nh, design.capacity, d), wt)
    ff = spec.decoder_ffn
    ins = (x, vec, vec, *lin(3 * h, h), *lin(h, h), vec, vec, *lin(h, h), *lin(h, h), heads,
           heads, vec, vec, *lin(ff, h), *lin(h, ff))
    return ins, (x, cache, cache)


def model_designs(model: str, precision: str = "bf16", chunk: int = DEFAULT_CHUNK
                  ) -> tuple[list[Example], list[str]]:
    """(buildable examples, "design: why not" for the rest), each distinct design once: the
    encoder Program's and the decoder's for every rows bucket 1, 2, 4, ... up to `chunk` (what
    WhisperModel launches with that chunk: the artifact keys follow)."""
    from torch_xdna.models.speech.whisper import read_whisper
    spec = read_whisper(model).spec
    designs = list(encoder_designs(spec, precision))
    buckets = sorted({rows_bucket(1 << k, chunk) for k in range(chunk.bit_length())}, reverse=True)
    for rows in buckets:
        designs += step_designs(spec, precision, rows, cache_rows(spec.target_positions))
    seen, examples = set(), []
    for d in designs:
        if d.key in seen:
            continue
        seen.add(d.key)
        ins, outs = launch_operands(spec, d, precision)
        examples.append(Example(d, ins, outs))
    return examples, []
