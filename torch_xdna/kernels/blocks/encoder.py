"""Fused encoder (BERT-family) blocks: one launch each for embeddings, attention, FFN and pooling.

A fused design is a sequence of component designs run back to back on the array. Its reference
has the components' numerics (bf16 operands, fp32 accumulation; the vector steps call the
VectorDesign/EmbeddingDesign references, attention runs attention_reference's ops); its plan is the
components' plans combined: DRAM bytes and compute add up (the intermediates between components
are counted as spilled to DRAM, a conservative choice), and the capacity checks are the
components' own, so an oversized shape raises their PlanError. Weights are bf16 (the operand
format), so the GEMMs here are bf16 GEMMs. `precision="fp32"` is the verification mode
(kernels/blocks/encoder_exact.py: nothing rounded; planned as the bf16 blocks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import torch

from torch_xdna.hw import Generation
from torch_xdna.kernels import numerics
from torch_xdna.kernels.host import fused as host_fused
from torch_xdna.kernels.host import gemm as host_gemm
from torch_xdna.kernels.activations import apply_epilogue_
from torch_xdna.kernels.ops.attention import attention_reference
from torch_xdna.kernels.base import Design
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.blocks import encoder_exact as exact
from torch_xdna.kernels.stages import encoder as encoder_stages
from torch_xdna.kernels.stages.encoder import layer_norm_design
from torch_xdna.kernels.stages.llm_layer import cached_runs
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.kernels.blocks.toolkit import combine_plans
from torch_xdna.kernels.ops.vector import OPS as VECTOR_OPS, EmbeddingDesign, VectorDesign
from torch_xdna.runtime.plan import Plan, PlanError


def _operand_w(t: torch.Tensor) -> torch.Tensor:
    # a resident bf16 weight already is an operand (real weights hold no subnormals to flush); the
    # shared cache saves the simulator re-converting it on every launch
    return OPERANDS.get([t], "bf16", 0) if t.dtype == torch.bfloat16 else numerics.operand(t)


def _packed_w(t: torch.Tensor) -> torch.Tensor | None:
    # a resident weight's oneDNN packed form, made once per weight content (host_gemm.pack;
    # None where that GEMM is not used), kept with the operand copies
    if (t.dtype != torch.bfloat16 or t.dim() != 2 or not host_gemm.packing_enabled()
            or not host_gemm.packed_invariant(*t.shape)):
        return None
    return OPERANDS.derived(("mkldnn_linear", host_gemm.PACK_ROWS_HINT), [t],
                            lambda: host_gemm.pack(_operand_w(t)))


def _gemm_operand(x: torch.Tensor) -> torch.Tensor:
    # numerics.gemm_operand in one host pass where host_fused can (the same bits)
    if (x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1
            and host_fused.available()):
        return host_fused.gemm_operand(x)
    return numerics.gemm_operand(x)


def linear_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, chunk: int = 0,
                act: str = "none", residual: torch.Tensor | None = None,
                rounded: bool = False, operand_out: bool = False) -> torch.Tensor:
    """act(x @ w + b) (+ residual) with the GEMM designs' numerics (bf16 operands, fp32
    accumulation). The array computes each output tile on its own, so a row's result never
    depends on the other rows of the batch: host_gemm.gemm_rows keeps that property (one host
    GEMM where this host's BLAS is row-invariant, see host_gemm.rows_invariant). `chunk` is
    accepted for callers of the older blocked form; rows are independent either way.
    Bias, epilogue and residual run in place on the fresh accumulator (the same ops in the same
    order as apply_epilogue, so the same values). `rounded`: x already is a GEMM operand.
    `operand_out`: return numerics.gemm_operand of the result (it only feeds GEMMs); bias,
    epilogue and rounding then run as one host pass where host_fused can (the same bits)."""
    acc = host_gemm.gemm_rows(x if rounded else _gemm_operand(x), _operand_w(w),
                              _packed_w(w))
    bias = _operand_w(b)
    if operand_out and residual is None and act in host_fused.ACTS and host_fused.available():
        return host_fused.bias_act_operand(acc, bias, act)
    acc = apply_epilogue_(act, acc.add_(bias))
    if residual is not None:
        acc.add_(residual.float())
    return numerics.gemm_operand(acc) if operand_out else acc


def linear_residual_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                               residual: torch.Tensor, ln: VectorDesign, ln_w: torch.Tensor,
                               ln_b: torch.Tensor) -> torch.Tensor:
    """LayerNorm(x @ w + b + residual) for an operand x: ln.reference on linear_rows(x, w, b,
    residual=residual, rounded=True), returned. Where host_fused can, bias, residual and the
    rounding of the norm's input (the vector unit reads bf16 operands) are one host pass and the
    norm runs the same function on it (the same bits; sim speed, tests/test_host_fused.py)."""
    if not host_fused.available():
        y = linear_rows(x, w, b, residual=residual, rounded=True)
        out = torch.empty_like(y)
        ln.reference([y, ln_w, ln_b], [out])
        return out
    acc = host_gemm.gemm_rows(x, _operand_w(w), _packed_w(w))
    xo = host_fused.bias_residual_operand(acc, _operand_w(b), residual.float())
    norm = VECTOR_OPS[ln.op][0]
    return norm([xo, numerics.operand(ln_w), numerics.operand(ln_b)], **dict(ln.params))


def prefix_lengths(mask: torch.Tensor) -> list[int] | None:
    """Per-sequence token counts of an additive [B, S] mask that keeps a prefix of each row
    (0 ... 0 then -inf ... -inf, as the embedder writes it); None for any other mask."""
    keep = mask == 0
    n = keep.sum(1)
    s = mask.shape[1]
    prefix = torch.arange(s).unsqueeze(0) < n.unsqueeze(1)
    if not torch.equal(keep, prefix) or not bool(torch.isneginf(mask[~prefix]).all()):
        return None
    return n.tolist()


def real_rows(lengths: list[int], seq: int) -> torch.Tensor:
    """Row indices (into the padded [B*S] layout) of the real tokens, sequence by sequence."""
    return torch.cat([torch.arange(i * seq, i * seq + n) for i, n in enumerate(lengths)])


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """attention_reference(q, k, v, scale=scale, rounded=True) without a mask (q, k, v already
    operands), the same ops in the same order, with the probabilities' NaN guard and rounding
    to the P V operand as one host pass where host_fused can (the same bits; sim speed)."""
    p = torch.softmax(torch.matmul(q, k.transpose(-1, -2)).mul_(scale), dim=-1)
    if host_fused.available():
        p = host_fused.probs_operand_(p)
    else:
        p = numerics.operand_nonneg(torch.nan_to_num_(p, nan=0.0))
    return torch.matmul(p, v)


def equal_runs(lengths: list[int]) -> list[tuple[int, int]]:
    """(length, count) of each run of consecutive equal lengths. Attention runs one batched call
    per run: every sequence in it still attends over its own n tokens only (the per-sequence
    matrices of a batched matmul and the rows of a softmax are computed independently, so the
    bits are those of one call per sequence; tests/test_encoder_fastpath.py checks)."""
    runs: list[tuple[int, int]] = []
    for n in lengths:
        if runs and runs[-1][0] == n:
            runs[-1] = (n, runs[-1][1] + 1)
        else:
            runs.append((n, 1))
    return runs


def scatter_rows(out: torch.Tensor, rows: torch.Tensor, y: torch.Tensor) -> None:
    """out[rows] = y, every other (padding) row zero (finite, so a masked pool stays exact);
    only the padding rows are zeroed (sim speed: they are ~6% of a sorted batch)."""
    pad = torch.ones(out.shape[0], dtype=torch.bool)
    pad[rows] = False
    out.index_fill_(0, pad.nonzero().squeeze(1), 0.0)
    out.index_copy_(0, rows, y.to(out.dtype))


def _staged(d: Design) -> bool:
    """numerics.layer_order() == "plan" and the block runs as stages: its functional level then
    computes in the stage programs' order (stages/encoder.py)."""
    return numerics.layer_order() == "plan" and encoder_stages.unsupported(d) is None


class FusedBlock(Design):
    """Shared plan logic: subclasses list their component designs."""

    def components(self) -> list[Design]:
        raise NotImplementedError

    def runs(self) -> tuple:
        """The blocks that run as stages (kernels/stages/encoder.py): one run per stage program,
        as their staged artifacts do; the others one run per launch."""
        if self.kind not in encoder_stages.KINDS:
            return (self.key,)
        return cached_runs(self, encoder_stages.stages)

    def plan(self, gen: Generation) -> Plan:
        return combine_plans(self.kind, [c.plan(gen) for c in self.components()])


@dataclass(frozen=True)
class EncoderEmbeddingDesign(FusedBlock):
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
    precision: str = "bf16"
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
        if _staged(self):                    # the stage programs' order (txn-identical)
            encoder_stages.staged_reference(self, inputs, outputs)
            return
        if self.precision == "fp32":
            outputs[0].copy_(exact.embedding(word, pos, typ, ln_w, ln_b, ids,
                                             types[0] if self.typed else None, self.batch,
                                             self.seq, self.eps))
            return
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
class EncoderAttentionDesign(FusedBlock):
    """out = LayerNorm(x + (softmax(QK^T/sqrt(D) + mask) V) Wo + bo), QKV = x Wqkv + bqkv.

    inputs: x [B*S,H], w_qkv [H,3H], b_qkv [3H], mask [B,S] (additive: 0 or -inf), w_o [H,H],
    b_o [H], ln_w [H], ln_b [H]; output [B*S,H] fp32.
    """

    batch: int
    seq: int
    hidden: int
    heads: int
    eps: float
    precision: str = "bf16"
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
        if _staged(self):                    # the stage programs' order (txn-identical)
            encoder_stages.staged_reference(self, inputs, outputs)
            return
        if self.precision == "fp32":
            outputs[0].copy_(exact.attention(x, w_qkv, b_qkv, mask, w_o, b_o, ln_w, ln_b, b, s,
                                             nh, self.eps))
            return
        lengths = prefix_lengths(mask.view(b, s))
        if lengths is None:                  # a general additive mask: the padded layout
            qkv = linear_rows(x, w_qkv, b_qkv)
            q, k, v = qkv.view(b, s, 3, nh, d).permute(2, 0, 3, 1, 4)
            ctx = attention_reference(q, k, v, scale=1.0 / math.sqrt(d),
                                      mask=mask.view(b, 1, 1, s))
            ctx = ctx.permute(0, 2, 1, 3).reshape(b * s, h)
            y = linear_rows(ctx, w_o, b_o, residual=x)
            self._ln.reference([y, ln_w, ln_b], outputs)
            return
        # padding keys get probability exp(-inf) = 0 and add exact zeros to every sum, so each
        # sequence is computed over its real tokens only: its result then depends on nothing but
        # its own tokens (not on the batch's padded length or partners), and padding costs nothing
        rows = real_rows(lengths, s)
        xr = x.index_select(0, rows)
        r = len(rows)
        # Q, K, V rounded once (they only feed products) and laid out head-major in the same
        # copy, so each sequence's per-head [n, D] blocks are contiguous for the batched GEMMs
        if host_fused.available():                 # bias, rounding and layout in one pass
            acc = host_gemm.gemm_rows(_gemm_operand(xr), _operand_w(w_qkv), _packed_w(w_qkv))
            qkv = host_fused.bias_operand_heads(acc, _operand_w(b_qkv), d).view(3, nh, r, d)
        else:
            qkv = torch.empty(3, nh, r, d)
            qkv.copy_(linear_rows(xr, w_qkv, b_qkv, operand_out=True)
                      .view(r, 3, nh, d).permute(1, 2, 0, 3))
        ctx = torch.empty(nh, r, d)
        off = 0
        for n, g in equal_runs(lengths):
            if n:
                # g consecutive sequences of n tokens: one batched call over [nh, g, n, D]
                q, k, v = qkv[:, :, off:off + g * n].unflatten(2, (g, n))
                ctx[:, off:off + g * n].view(nh, g, n, d).copy_(
                    encoder_attention(q, k, v, 1.0 / math.sqrt(d)))
                off += g * n
        ctx_op = torch.empty(r, nh, d)             # rounded and back to token-major in one copy
        ctx_op.copy_(numerics.gemm_operand_bf16(ctx).transpose(0, 1))
        ln = linear_residual_layer_norm(ctx_op.view(r, h), w_o, b_o, xr, self._ln, ln_w, ln_b)
        scatter_rows(outputs[0], rows, ln)


@dataclass(frozen=True)
class EncoderFFNDesign(FusedBlock):
    """out = LayerNorm(x + act(x W1 + b1) W2 + b2).

    inputs: x [R,H], w1 [H,I], b1 [I], w2 [I,H], b2 [H], ln_w [H], ln_b [H]; output [R,H] fp32.
    `chunk`: the sequence length S of the rows' [R/S, S] layout (0 = all rows one sequence).
    `masked`: an 8th input, the additive [R/S, S] attention mask, marks the padding rows, which the
    reference skips (their output rows are zero): a row's result never depends on the other rows.
    """

    rows: int
    hidden: int
    intermediate: int
    eps: float
    act: str = "gelu"
    chunk: int = 0
    masked: bool = False
    precision: str = "bf16"
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
        x, w1, b1, w2, b2, ln_w, ln_b = inputs[:7]
        if _staged(self):                    # the stage programs' order (txn-identical)
            encoder_stages.staged_reference(self, inputs[:7], outputs)
            return
        if self.precision == "fp32":
            outputs[0].copy_(exact.ffn(x, w1, b1, w2, b2, ln_w, ln_b, self.act, self.eps))
            return
        lengths = None
        if self.masked:
            lengths = prefix_lengths(inputs[7].view(self.rows // self.chunk, self.chunk))
        if lengths is None:
            inter = linear_rows(x, w1, b1, act=self.act, operand_out=True)
            y = linear_rows(inter, w2, b2, residual=x, rounded=True)
            self._ln.reference([y, ln_w, ln_b], outputs)
            return
        rows = real_rows(lengths, self.chunk)
        xr = x.index_select(0, rows)
        inter = linear_rows(xr, w1, b1, act=self.act, operand_out=True)
        ln = linear_residual_layer_norm(inter, w2, b2, xr, self._ln, ln_w, ln_b)
        scatter_rows(outputs[0], rows, ln)


POOL_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


@dataclass(frozen=True)
class EncoderPoolDesign(FusedBlock):
    """Sentence vector, as sentence-transformers' Pooling computes it over the kept tokens: mean,
    first (cls), max, sum / sqrt(n), position-weighted mean or last token; then L2-normalized.

    inputs: x [B*S,H], mask [B,S] (additive: 0 keeps a token; the embedder drops prompt tokens
    here when the model's pooling excludes them); output [B,H] fp32. Rows with no tokens (batch
    padding) give zeros. Each row is pooled over its own kept tokens only (batch invariance).
    """

    batch: int
    seq: int
    hidden: int
    mode: str = "mean"
    normalize: bool = True
    precision: str = "bf16"
    kind = "encoder_pool"

    def __post_init__(self):
        if self.mode not in POOL_MODES:
            raise ValueError(f"{self.kind}: pooling {self.mode!r} not supported "
                             f"({', '.join(POOL_MODES)})")

    def components(self) -> list[Design]:
        b, s, h, f32 = self.batch, self.seq, self.hidden, torch.float32
        parts: list[Design] = []
        if self.mode in ("cls", "lasttoken"):
            parts.append(VectorDesign("copy", ((b, h),), (f32,), (b, h), f32))
        else:
            op = "amax" if self.mode == "max" else "sum"
            parts.append(VectorDesign(op, ((b, s, h),), (f32,), (b, h), f32,
                                      (("dims", (1,)), ("keepdim", False))))
        if self.normalize:
            parts.append(VectorDesign("rms_norm", ((b, h),), (f32,), (b, h), f32,
                                      (("eps", 0.0), ("has_weight", False))))
        return parts

    def _pool_row(self, xi: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        # sums and counts run on the fp32 accumulator path, max is a comparison: exact
        n, mode = xi.shape[0], self.mode
        if mode == "mean":
            return xi.sum(0) / n
        if mode == "mean_sqrt_len_tokens":
            return xi.sum(0) / math.sqrt(n)
        if mode == "max":
            return xi.amax(0)
        if mode == "cls":
            return xi[0]
        if mode == "lasttoken":
            return xi[-1]
        w = (idx + 1).to(torch.float32).unsqueeze(1)           # weightedmean: 1-based positions
        return (xi * w).sum(0) / w.sum()

    def reference(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                  **scalars: Any) -> None:
        x, mask = inputs
        if _staged(self):                    # the stage programs' order (txn-identical)
            encoder_stages.staged_reference(self, inputs, outputs)
            return
        b, s, h = self.batch, self.seq, self.hidden
        x = x.view(b, s, h).float()
        keep = mask.view(b, s) == 0
        pooled = torch.zeros(b, h)
        for i in range(b):
            lengths = prefix_lengths(mask.view(b, s)[i:i + 1])
            if lengths is not None:            # a prefix: the contiguous rows (no gather copy)
                idx = torch.arange(lengths[0])
                xi = x[i, :lengths[0]]
            else:
                idx = keep[i].nonzero().squeeze(1)
                xi = x[i].index_select(0, idx)
            if len(idx):
                pooled[i] = self._pool_row(xi, idx)
        if self.normalize:
            p = pooled if self.precision == "fp32" else numerics.operand(pooled)
            norm = (p * p).sum(-1, keepdim=True).sqrt().clamp(min=1e-12)
            pooled = p / norm
        numerics.store(pooled, outputs[0])


@dataclass(frozen=True)
class EncoderClassifierHeadDesign(FusedBlock):
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
