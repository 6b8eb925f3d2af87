"""The resident weights and per-bucket launches of a pre-norm rotary encoder (ModernBERT, ESM-2)
for the Embedder: the same Program shape as BERT's (embedding, then per layer an attention and an
FFN launch, then pooling) with the blocks of kernels/blocks/encoder_prenorm.py and a final norm."""
from __future__ import annotations

import torch

from torch_xdna.kernels.blocks.encoder import EncoderPoolDesign
from torch_xdna.kernels.blocks.encoder_prenorm import (EncoderNormDesign, PreNormAttentionDesign,
                                                       PreNormEmbeddingDesign, PreNormFFNDesign,
                                                       rope_table)
from torch_xdna.models.encoder import EncoderSpec
from torch_xdna.runtime import Launch, TensorArg

# ESM's token dropout: training masked 15% x 80% of tokens, so embeddings are scaled by
# (1 - 0.12) / (1 - the sequence's share of <mask> tokens) (transformers EsmEmbeddings)
ESM_MASK_RATIO_TRAIN = 0.15 * 0.8


def host_weights(spec: EncoderSpec, w: dict[str, torch.Tensor],
                 dt: torch.dtype) -> dict[str, torch.Tensor]:
    """Canonical checkpoint tensors -> resident host tensors: GEMM weights [K, N] in `dt`, one
    cos/sin table pair per RoPE base (fp32: the angle is kept exact, as the LLM blocks do)."""
    host = {"word_emb": w["word_emb"].to(dt), "emb_ln.w": w["emb_ln.w"].to(dt),
            "emb_ln.b": w["emb_ln.b"].to(dt), "final_ln.w": w["final_ln.w"].to(dt),
            "final_ln.b": w["final_ln.b"].to(dt)}
    for i in range(spec.layers):
        for site in ("qkv", "o", "up", "down"):
            host[f"{i}.{site}.w"] = w[f"{i}.{site}.w"].t().contiguous().to(dt)
            host[f"{i}.{site}.b"] = w[f"{i}.{site}.b"].to(dt)
        for ln in ("attn_ln", "ffn_ln"):
            host[f"{i}.{ln}.w"] = w[f"{i}.{ln}.w"].to(dt)
            host[f"{i}.{ln}.b"] = w[f"{i}.{ln}.b"].to(dt)
    for theta in sorted(set(spec.arch.thetas)):
        cos, sin = rope_table(spec.max_position, spec.head_dim, theta)
        host[f"rope{theta}.cos"], host[f"rope{theta}.sin"] = cos, sin
    return host


def row_scale(spec: EncoderSpec, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """[B*S] embedding scale per row: ESM's token-dropout factor per sequence (0 at <mask>
    tokens), else ones."""
    b, s = ids.shape
    scale = torch.ones(b, s)
    arch = spec.arch
    if arch is not None and arch.token_dropout:
        for i, n in enumerate(lengths):
            is_mask = ids[i] == arch.mask_token_id
            masked = int(is_mask[:n].sum()) if n else 0
            scale[i] = (1 - ESM_MASK_RATIO_TRAIN) / (1 - masked / max(n, 1))
            scale[i, is_mask] = 0.0             # <mask> tokens enter as zeros (dropped out)
    return scale.view(-1)


def designs(spec: EncoderSpec, b: int, s: int, precision: str = "bf16",
            table_dtype: torch.dtype = torch.bfloat16) -> list:
    """The Program's designs for one (batch, seq) bucket, in launch order: embedding, per layer
    attention then FFN, final norm, pooling (the estimator charges exactly these)."""
    arch = spec.arch
    ffn = PreNormFFNDesign(b, s, spec.hidden, spec.intermediate, spec.eps, act=spec.act,
                           gated=arch.gated, precision=precision)
    out: list = [PreNormEmbeddingDesign(spec.vocab, spec.hidden, b, s, spec.eps,
                                        norm=arch.emb_norm, table_dtype=table_dtype,
                                        precision=precision)]
    for i in range(spec.layers):
        out += [PreNormAttentionDesign(b, s, spec.hidden, spec.heads, spec.eps,
                                       window=arch.windows[i],
                                       norm=i > 0 or arch.first_attn_norm, precision=precision),
                ffn]
    return out + [EncoderNormDesign(b, s, spec.hidden, spec.eps, precision=precision),
                  EncoderPoolDesign(b, s, spec.hidden, spec.pooling, spec.normalize,
                                    precision=precision)]


def launches(spec: EncoderSpec, w: dict[str, TensorArg], b: int, s: int, ids: TensorArg,
             scale: TensorArg, mask: TensorArg, pool_mask: TensorArg, xa: TensorArg,
             xb: TensorArg, out: TensorArg, precision: str) -> tuple[list[Launch], TensorArg]:
    """The Program's launches for one (batch, seq) bucket, and the buffer holding the final
    token states (per-residue outputs)."""
    arch = spec.arch
    emb, *layers, norm, pool = designs(spec, b, s, precision, w["word_emb"].dtype)
    run = [Launch(emb, [w["word_emb"], w["emb_ln.w"], w["emb_ln.b"], ids, scale], [xa],
                  op="embeddings")]
    for i in range(spec.layers):
        attn, ffn = layers[2 * i], layers[2 * i + 1]
        rope = f"rope{arch.thetas[i]}"
        run.append(Launch(attn, [xa, w[f"{i}.attn_ln.w"], w[f"{i}.attn_ln.b"], w[f"{i}.qkv.w"],
                                 w[f"{i}.qkv.b"], mask, w[f"{i}.o.w"], w[f"{i}.o.b"],
                                 w[rope + ".cos"], w[rope + ".sin"]], [xb],
                          op=f"layer{i}.attention"))
        run.append(Launch(ffn, [xb, w[f"{i}.ffn_ln.w"], w[f"{i}.ffn_ln.b"], w[f"{i}.up.w"],
                                w[f"{i}.up.b"], w[f"{i}.down.w"], w[f"{i}.down.b"], mask], [xa],
                          op=f"layer{i}.ffn"))
    run.append(Launch(norm, [xa, w["final_ln.w"], w["final_ln.b"], mask], [xb], op="final_norm"))
    run.append(Launch(pool, [xb, pool_mask], [out], op="pool"))
    return run, xb
