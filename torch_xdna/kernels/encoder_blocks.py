"""Fused encoder (BERT-family) blocks: one launch each for embeddings, attention, FFN and pooling.

A fused design is a sequence of component designs run back to back on the array. Its reference
has the components' numerics (bf16 operands, fp32 accumulation; the vector steps call the
VectorDesign/EmbeddingDesign references, attention calls attention_reference); its plan is the
components' plans combined: DRAM bytes and compute add up (the intermediates between components
are counted as spilled to DRAM, a conservative choice), and the capacity checks are the
components' own, so an oversized shape raises their PlanError. Weights are bf16 (the operand
format), so the GEMMs here are bf16 GEMMs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.activations import apply_epilogue
from torch_xdna.kernels.attention import attention_reference
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.gemm import GemmDesign
from torch_xdna.kernels.llm_blocks import OPERANDS
from torch_xdna.kernels.vector import EmbeddingDesign, VectorDesign
from torch_xdna.runtime.plan import Plan, PlanError


def combine_plans(design: str, plans: Sequence[Plan]) -> Plan:
    """One plan for components run in sequence: resources are the max, traffic and time the sum."""
    return Plan(
        design=design, dtype=plans[0].dtype,
        columns=max(p.columns for p in plans), cores=max(p.cores for p in plans),
        tile=plans[0].tile, l1_bytes=max(p.l1_bytes for p in plans),
        memtile_bytes=max(p.memtile_bytes for p in plans),
        core_bds=max(p.core_bds for p in plans), memtile_bds=max(p.memtile_bds for p in plans),
        core_locks=max(p.core_locks for p in plans), shim_tasks=max(p.shim_tasks for p in plans),
        double_buffered=all(p.double_buffered for p in plans),
        dram_read_bytes=sum(p.dram_read_bytes for p in plans),
        dram_write_bytes=sum(p.dram_write_bytes for p in plans),
        macs=sum(p.macs for p in plans), padded_macs=sum(p.padded_macs for p in plans),
        vector_elems=sum(p.vector_elems for p in plans),
        compute_cycles=sum(p.compute_cycles for p in plans),
        dma_shapes=tuple(s for p in plans for s in p.dma_shapes),
        notes={"components": tuple(p.summary() for p in plans)})


def layer_norm_design(rows: int, dim: int, eps: float) -> VectorDesign:
    f32 = torch.float32
    return VectorDesign("layer_norm", ((rows, dim), (dim,), (dim,)), (f32, torch.bfloat16, torch.bfloat16),
                        (rows, dim), f32, (("eps", eps), ("has_bias", True), ("has_weight", True),
                                           ("norm_dims", 1)))


def linear_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, chunk: int, act: str = "none",
                residual: torch.Tensor | None = None) -> torch.Tensor:
    """act(x @ w + b) (+ residual) with the GEMM designs' numerics (bf16 operands, fp32
    accumulation), multiplied `chunk` rows at a time. The array computes each output tile on its
    own, so a row's result never depends on the other rows of the batch; one big host matmul would
    pick different kernels (and rounding) per batch size, so we keep the blocks fixed too."""
    xo = numerics.operand(x)
    # a resident bf16 weight already is an operand (real weights hold no subnormals to flush); the
    # shared cache saves the simulator re-converting it on every launch
    wo = OPERANDS.get([w], "bf16", 0) if w.dtype == torch.bfloat16 else numerics.operand(w)
    rows, k = xo.shape
    if rows % chunk == 0:
        # one [chunk, K] x [K, N] product per block (a batched GEMM over an expanded weight: the
        # same per-block kernel as a loop, without the per-call overhead)
        nb = rows // chunk
        acc = torch.bmm(xo.view(nb, chunk, k), wo.expand(nb, *wo.shape)).view(rows, -1)
    else:
        acc = torch.cat([torch.matmul(xo[i:i + chunk], wo) for i in range(0, rows, chunk)])
    acc = apply_epilogue(act, acc + numerics.operand(b))
    return acc + residual.float() if residual is not None else acc


class _Fused(Design):
    """Shared plan logic: subclasses list their component designs."""

    def components(self) -> list[Design]:
        raise NotImplementedError

    def plan(self, gen: Generation) -> Plan:
        return combine_plans(self.kind, [c.plan(gen) for c in self.components()])


@dataclass(frozen=True)
class EncoderEmbeddingDesign(_Fused):
    """x = LayerNorm(word[ids] + pos[0..S) + type[t]) for a [batch, seq] id tensor.

    inputs: word [V,H], pos [P,H], type [T,H], ln_w [H], ln_b [H], ids int32 [B*S], and with
    `typed` token-type ids int32 [B*S] (sentence pairs: cross-encoders); otherwise t = 0.
    Output [B*S,H].
    """

    vocab: int
    max_position: int
    hidden: int
    batch: int
    seq: int
    eps: float
    table_dtype: torch.dtype = torch.bfloat16
    typed: bool = False
    type_vocab: int = 2
    kind = "encoder_embedding"

    def plan(self, gen: Generation) -> Plan:
        if self.seq > self.max_position:
            raise PlanError(f"{self.kind} seq={self.seq}", "position table length", self.seq,
                            self.max_position, "truncate inputs to max_position_embeddings")
        return super().plan(gen)

    @cached_property
    def _word(self) -> EmbeddingDesign:
        return EmbeddingDesign(self.vocab, self.hidden, self.batch * self.seq, self.table_dtype)

    @cached_property
    def _ln(self) -> VectorDesign:
        return layer_norm_design(self.batch * self.seq, self.hidden, self.eps)

    def components(self) -> list[Design]:
        rows, h, f32 = self.batch * self.seq, self.hidden, torch.float32
        pos = EmbeddingDesign(self.max_position, h, rows, self.table_dtype)
        add = VectorDesign("add", ((rows, h), (rows, h)), (f32, f32), (rows, h), f32)
        typ = [EmbeddingDesign(self.type_vocab, h, rows, self.table_dtype), add] if self.typed else []
        return [self._word, pos, add, *typ, self._ln]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        word, pos, typ, ln_w, ln_b, ids, *types = inputs
        rows, h = self.batch * self.seq, self.hidden
        x = torch.empty(rows, h)
        self._word.reference([word, ids], [x])
        # pure additions run on the fp32 accumulator path (exact)
        x.view(self.batch, self.seq, h).add_(pos[:self.seq].float())
        if self.typed:
            t = types[0].long().clamp(0, self.type_vocab - 1)
            x.add_(typ[t].float())
        else:
            x.add_(typ[0].float())
        self._ln.reference([x, ln_w, ln_b], outputs)


@dataclass(frozen=True)
class EncoderAttentionDesign(_Fused):
    """out = LayerNorm(x + (softmax(QK^T/sqrt(D) + mask) V) Wo + bo), QKV = x Wqkv + bqkv.

    inputs: x [B*S,H], w_qkv [H,3H], b_qkv [3H], mask [B,S] (additive: 0 or -inf), w_o [H,H],
    b_o [H], ln_w [H], ln_b [H]; output [B*S,H] fp32.
    """

    batch: int
    seq: int
    hidden: int
    heads: int
    eps: float
    kind = "encoder_attention"

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"{self.kind}: hidden {self.hidden} not divisible by heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @cached_property
    def _qkv(self) -> GemmDesign:
        return GemmDesign(self.batch * self.seq, self.hidden, 3 * self.hidden, dtype="bf16",
                          bias=True)

    @cached_property
    def _out(self) -> GemmDesign:
        return GemmDesign(self.batch * self.seq, self.hidden, self.hidden, dtype="bf16",
                          bias=True, residual=True)

    @cached_property
    def _ln(self) -> VectorDesign:
        return layer_norm_design(self.batch * self.seq, self.hidden, self.eps)

    def components(self) -> list[Design]:
        bh, s, d, f32 = self.batch * self.heads, self.seq, self.head_dim, torch.float32
        scores = GemmDesign(s, d, s, batch=bh, dtype="bf16")
        softmax = VectorDesign("softmax", ((bh * s, s),), (f32,), (bh * s, s), f32, (("dim", -1),))
        pv = GemmDesign(s, s, d, batch=bh, dtype="bf16")
        return [self._qkv, scores, softmax, pv, self._out, self._ln]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, w_qkv, b_qkv, mask, w_o, b_o, ln_w, ln_b = inputs
        b, s, h, nh, d = self.batch, self.seq, self.hidden, self.heads, self.head_dim
        qkv = linear_rows(x, w_qkv, b_qkv, chunk=s)
        q, k, v = qkv.view(b, s, 3, nh, d).permute(2, 0, 3, 1, 4)
        ctx = attention_reference(q, k, v, scale=1.0 / math.sqrt(d), mask=mask.view(b, 1, 1, s))
        ctx = ctx.permute(0, 2, 1, 3).reshape(b * s, h)
        y = linear_rows(ctx, w_o, b_o, chunk=s, residual=x)
        self._ln.reference([y, ln_w, ln_b], outputs)


@dataclass(frozen=True)
class EncoderFFNDesign(_Fused):
    """out = LayerNorm(x + act(x W1 + b1) W2 + b2).

    inputs: x [R,H], w1 [H,I], b1 [I], w2 [I,H], b2 [H], ln_w [H], ln_b [H]; output [R,H] fp32.
    `chunk`: rows multiplied as one block in the reference (the sequence length, so a sequence's
    result does not depend on its batch neighbours); 0 = all rows.
    """

    rows: int
    hidden: int
    intermediate: int
    eps: float
    act: str = "gelu"
    chunk: int = 0
    kind = "encoder_ffn"

    def __post_init__(self):
        if self.chunk == 0:
            object.__setattr__(self, "chunk", self.rows)

    @cached_property
    def _up(self) -> GemmDesign:
        return GemmDesign(self.rows, self.hidden, self.intermediate, dtype="bf16", bias=True,
                          epilogue=self.act)

    @cached_property
    def _down(self) -> GemmDesign:
        return GemmDesign(self.rows, self.intermediate, self.hidden, dtype="bf16", bias=True,
                          residual=True)

    @cached_property
    def _ln(self) -> VectorDesign:
        return layer_norm_design(self.rows, self.hidden, self.eps)

    def components(self) -> list[Design]:
        return [self._up, self._down, self._ln]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, w1, b1, w2, b2, ln_w, ln_b = inputs
        inter = linear_rows(x, w1, b1, chunk=self.chunk, act=self.act)
        y = linear_rows(inter, w2, b2, chunk=self.chunk, residual=x)
        self._ln.reference([y, ln_w, ln_b], outputs)


@dataclass(frozen=True)
class EncoderPoolDesign(_Fused):
    """Sentence vector: mean over unmasked tokens (or the first token), then L2-normalized.

    inputs: x [B*S,H], mask [B,S] (additive: 0 keeps a token); output [B,H] fp32. Rows with no
    tokens (batch padding) give zeros.
    """

    batch: int
    seq: int
    hidden: int
    mode: str = "mean"           # "mean" | "cls"
    normalize: bool = True
    kind = "encoder_pool"

    def __post_init__(self):
        if self.mode not in ("mean", "cls"):
            raise ValueError(f"{self.kind}: pooling {self.mode!r} not supported (mean, cls)")

    def components(self) -> list[Design]:
        b, s, h, f32 = self.batch, self.seq, self.hidden, torch.float32
        parts: list[Design] = []
        if self.mode == "mean":
            parts.append(VectorDesign("sum", ((b, s, h),), (f32,), (b, h), f32,
                                      (("dims", (1,)), ("keepdim", False))))
        else:
            parts.append(VectorDesign("copy", ((b, h),), (f32,), (b, h), f32))
        if self.normalize:
            parts.append(VectorDesign("rms_norm", ((b, h),), (f32,), (b, h), f32,
                                      (("eps", 0.0), ("has_weight", False))))
        return parts

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, mask = inputs
        b, s, h = self.batch, self.seq, self.hidden
        x = x.view(b, s, h).float()
        keep = (mask.view(b, s) == 0).float()
        if self.mode == "mean":
            # masked sum and count are additions: fp32 accumulator path
            pooled = (x * keep.unsqueeze(-1)).sum(1) / keep.sum(1, keepdim=True).clamp(min=1.0)
        else:
            pooled = x[:, 0] * keep[:, :1]
        if self.normalize:
            p = numerics.operand(pooled)
            norm = (p * p).sum(-1, keepdim=True).sqrt().clamp(min=1e-12)
            pooled = p / norm
        numerics.store(pooled, outputs[0])


@dataclass(frozen=True)
class EncoderClassifierHeadDesign(_Fused):
    """Sequence-classification head (BertForSequenceClassification): the first token's hidden
    state, the pooler tanh(h W_p + b_p), then the classifier logits = pooled W_c + b_c.

    inputs: x [B*S,H], w_p [H,H], b_p [H], w_c [H,L], b_c [L]; output [B,L] fp32. Each row is
    multiplied on its own (chunk 1), so a pair's logit never depends on its batch partners.
    """

    batch: int
    seq: int
    hidden: int
    labels: int = 1
    kind = "encoder_classifier_head"

    def components(self) -> list[Design]:
        b, h, f32 = self.batch, self.hidden, torch.float32
        return [VectorDesign("copy", ((b, h),), (f32,), (b, h), f32),
                GemmDesign(b, h, h, dtype="bf16", bias=True, epilogue="tanh"),
                GemmDesign(b, h, self.labels, dtype="bf16", bias=True)]

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, w_p, b_p, w_c, b_c = inputs
        first = x.view(self.batch, self.seq, self.hidden)[:, 0].float()
        pooled = linear_rows(first, w_p, b_p, chunk=1, act="tanh")
        numerics.store(linear_rows(pooled, w_c, b_c, chunk=1), outputs[0])
