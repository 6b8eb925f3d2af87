"""Reranking with a cross-encoder on the NPU runtime: the embedder's encoder Program, with token
types in the embedding launch and one classifier-head launch (first token, pooler tanh GEMM,
classifier GEMM) at the end.

One pair is one sequence, so pairs are batched and bucketed exactly like embedding inputs (the
Embedder's buckets, workspaces and batch planning are reused); the logit's activation (sigmoid for
ms-marco style models) is applied on the host in fp32.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from torch_xdna.engine.embed.embedder import (EmbedStats, Embedder, Workspace, batch_bucket, bucket)
from torch_xdna.kernels.blocks.encoder import (EncoderAttentionDesign,
                                               EncoderClassifierHeadDesign,
                                               EncoderEmbeddingDesign, EncoderFFNDesign)
from torch_xdna.models.cross_encoder import (HeadSpec, PairTokenizer, load_cross_encoder_weights,
                                             load_head_spec)
from torch_xdna.models.encoder import EncoderSpec, load_spec
from torch_xdna.runtime import Device, Launch, Program, TensorArg


@dataclass
class _PairWorkspace(Workspace):
    types: TensorArg | None = None


@dataclass(frozen=True)
class RankResult:
    """One document's place: its index in the request, score (after the activation), raw logit."""

    index: int
    score: float
    logit: float


class Reranker(Embedder):
    """A cross-encoder resident on a device; `score(query, docs)` and `rank(query, docs)`."""

    def __init__(self, spec: EncoderSpec, head: HeadSpec, weights: dict[str, torch.Tensor],
                 tokenizer: PairTokenizer, device: Device | None = None, **kw):
        self.head = head
        super().__init__(spec, weights, tokenizer, device, **kw)      # uploads via _upload

    @classmethod
    def load(cls, model_dir: str | Path, device: Device | None = None,    # type: ignore[override]
             name: str | None = None, **kw) -> "Reranker":
        model_dir = Path(model_dir)
        spec = load_spec(model_dir, name=name)
        head = load_head_spec(model_dir)
        return cls(spec, head, load_cross_encoder_weights(model_dir, spec, head),
                   PairTokenizer(model_dir, spec), device, **kw)

    def _upload(self, w: dict[str, torch.Tensor]) -> dict[str, TensorArg]:
        up = super()._upload(w)
        bf = torch.bfloat16
        try:
            for k, t in (("pool_w", w["pool_w"].t().contiguous()), ("pool_b", w["pool_b"]),
                         ("cls_w", w["cls_w"].t().contiguous()), ("cls_b", w["cls_b"])):
                up[k] = self.dev.upload(t.to(bf))
        except Exception:
            for arg in up.values():
                self.dev.free(arg.buffer)
            raise
        return up

    def _build(self, b: int, s: int) -> _PairWorkspace:
        sp, dev, w, rows = self.spec, self.dev, self.w, b * s
        ids = dev.empty((rows,), torch.int32)
        types = dev.empty((rows,), torch.int32)
        mask = dev.empty((b, s), torch.float32)
        xa = dev.empty((rows, sp.hidden), torch.float32)
        xb = dev.empty((rows, sp.hidden), torch.float32)
        out = dev.empty((b, self.head.labels), torch.float32)
        emb = EncoderEmbeddingDesign(sp.vocab, sp.max_position, sp.hidden, b, s, sp.eps,
                                     typed=True, type_vocab=sp.type_vocab)
        attn = EncoderAttentionDesign(b, s, sp.hidden, sp.heads, sp.eps)
        ffn = EncoderFFNDesign(rows, sp.hidden, sp.intermediate, sp.eps, act=sp.act, chunk=s)
        head = EncoderClassifierHeadDesign(b, s, sp.hidden, self.head.labels)
        launches = [Launch(emb, [w["word_emb"], w["pos_emb"], w["type_emb"], w["emb_ln_w"],
                                 w["emb_ln_b"], ids, types], [xa], op="embeddings")]
        for i in range(sp.layers):
            launches.append(Launch(attn, [xa, w[f"{i}.w_qkv"], w[f"{i}.b_qkv"], mask, w[f"{i}.o.w"],
                                          w[f"{i}.o.b"], w[f"{i}.attn_ln.w"], w[f"{i}.attn_ln.b"]],
                                   [xb], op=f"layer{i}.attention"))
            launches.append(Launch(ffn, [xb, w[f"{i}.up.w"], w[f"{i}.up.b"], w[f"{i}.down.w"],
                                         w[f"{i}.down.b"], w[f"{i}.ffn_ln.w"], w[f"{i}.ffn_ln.b"]],
                                   [xa], op=f"layer{i}.ffn"))
        launches.append(Launch(head, [xa, w["pool_w"], w["pool_b"], w["cls_w"], w["cls_b"]], [out],
                               op="classifier_head"))
        return _PairWorkspace(ids, mask, out, [ids, types, mask, xa, xb, out],
                              Program(launches, name=f"{sp.name}.rerank[{b}x{s}]"), types)

    def embed(self, texts: list[str], stats: EmbedStats | None = None) -> torch.Tensor:
        raise TypeError(f"{self.name} is a cross-encoder: it scores (query, document) pairs; "
                        "use Reranker.score or Reranker.rank (or an embedding model for vectors)")

    # --- scoring ---------------------------------------------------------------------------
    def tokenize_pairs(self, query: str, docs: list[str]) -> list[tuple[list[int], list[int]]]:
        """(ids, token types) per document, truncated to max_seq_length (longest first)."""
        return self.tokenizer.encode_pairs(query, docs)

    def logits_ids(self, pairs: list[tuple[list[int], list[int]]],
                   stats: EmbedStats | None = None) -> torch.Tensor:
        """[len(pairs)] fp32 logits of tokenized pairs."""
        stats = stats if stats is not None else EmbedStats()
        limit = self.buckets[-1]
        for j, (ids, types) in enumerate(pairs):
            if not ids or len(ids) != len(types):
                raise ValueError(f"pair {j}: needs as many token types as ids (and some ids)")
            if len(ids) > limit:
                raise ValueError(f"pair {j} has {len(ids)} tokens; {self.name} takes at most "
                                 f"{limit}: truncate it (Reranker.tokenize_pairs does)")
        out = torch.empty(len(pairs))
        t0 = time.perf_counter()
        with self._lock:
            for idx in self.plan_batches([len(p[0]) for p in pairs]):
                out[idx] = self._run_pairs([pairs[i] for i in idx], stats)
        stats.inputs += len(pairs)
        stats.tokens += sum(len(p[0]) for p in pairs)
        stats.host_s += time.perf_counter() - t0
        return out

    def _run_pairs(self, pairs: list[tuple[list[int], list[int]]], stats: EmbedStats) -> torch.Tensor:
        n, s = len(pairs), bucket(max(len(p[0]) for p in pairs), self.buckets)
        b = batch_bucket(n, self.max_batch)
        ws = self._workspace(b, s)
        ids = torch.full((b, s), self.spec.pad_token_id, dtype=torch.int32)
        types = torch.zeros((b, s), dtype=torch.int32)
        mask = torch.full((b, s), float("-inf"))
        for i, (x, t) in enumerate(pairs):
            ids[i, :len(x)] = torch.tensor(x, dtype=torch.int32)
            types[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
            mask[i, :len(x)] = 0.0
        if bool(((ids < 0) | (ids >= self.spec.vocab)).any()):
            raise ValueError(f"token id out of range [0, {self.spec.vocab}) for {self.name}")
        if bool(((types < 0) | (types >= self.spec.type_vocab)).any()):
            raise ValueError(f"token type out of range [0, {self.spec.type_vocab}) for {self.name}")
        self.dev.write(ws.ids.buffer, ids)
        self.dev.write(ws.types.buffer, types)
        self.dev.write(ws.mask.buffer, mask)
        stats.run(self.dev, ws.program, (b, s))
        return self.dev.download(ws.out)[:n, 0]

    def activate(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) if self.head.activation == "sigmoid" else logits

    def score(self, query: str, docs: list[str], stats: EmbedStats | None = None) -> torch.Tensor:
        """[len(docs)] relevance scores of each document for `query` (the model's activation)."""
        return self.activate(self.logits_ids(self.tokenize_pairs(query, docs), stats))

    def rank(self, query: str, docs: list[str], top_n: int | None = None,
             stats: EmbedStats | None = None) -> list[RankResult]:
        """Documents best first (ties keep request order), cut to top_n."""
        logits = self.logits_ids(self.tokenize_pairs(query, docs), stats)
        return rank_logits(logits, self.activate(logits), top_n)


def rank_logits(logits: torch.Tensor, scores: torch.Tensor, top_n: int | None = None
                ) -> list[RankResult]:
    order = sorted(range(len(logits)), key=lambda i: (-float(logits[i]), i))
    if top_n is not None:
        order = order[:max(0, top_n)]
    return [RankResult(i, float(scores[i]), float(logits[i])) for i in order]
