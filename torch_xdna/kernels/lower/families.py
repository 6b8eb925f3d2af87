"""Design kind -> lowering function (one table, so `xdna design show` lists what lowers): fills
lower/dispatch.LOWERINGS, where `lower` looks a design's kind up."""
from __future__ import annotations

from torch_xdna.kernels.lower.attention import attention_program
from torch_xdna.kernels.lower.dispatch import LOWERINGS
from torch_xdna.kernels.lower.dma import concat_program, embedding_program, gather_program, \
    llm_embed_program
from torch_xdna.kernels.lower.encoder import encoder_programs
from torch_xdna.kernels.lower.fused import gated_gemm_programs, llm_block_programs, \
    prologue_gemm_programs
from torch_xdna.kernels.lower.gemm import gemm_programs
from torch_xdna.kernels.lower.vector import chain_program, vector_program
from torch_xdna.kernels.lower.whisper import whisper_programs

LOWERINGS.update({
    "gemm": lambda d, gen, **kw: gemm_programs(d, gen),
    "vector": lambda d, gen, **kw: vector_program(d, gen),
    "chain": lambda d, gen, **kw: chain_program(d, gen),
    "attention": attention_program,
    "concat": concat_program,
    "gather": gather_program,
    "embedding": embedding_program,
    "llm_embed": llm_embed_program,
    "gated_gemm": gated_gemm_programs,
    "prologue_gemm": prologue_gemm_programs,
    "llm_attention": llm_block_programs,
    "llm_mlp": llm_block_programs,
    "llm_head": llm_block_programs,
    "llm_layer": llm_block_programs,
    "encoder_attention": encoder_programs,
    "encoder_ffn": encoder_programs,
    "encoder_embedding": encoder_programs,
    "encoder_pool": encoder_programs,
    **{k: whisper_programs for k in ("whisper_stem", "whisper_encoder_layer", "whisper_cross_kv",
                                     "whisper_embed", "whisper_decoder_layer", "whisper_head")},
})
