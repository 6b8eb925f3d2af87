"""Reranking over HTTP: `/v1/rerank` in the Cohere/Jina shape (what TEI, Infinity and Lemonade
accept too) and TEI's own `/rerank` shape.

/v1/rerank  {model?, query, documents: [str | {text}], top_n?, return_documents?}
            -> {id, model, results: [{index, relevance_score, document?: {text}}], usage}
/rerank     {query, texts: [str], raw_scores?, return_text?, truncate?}
            -> [{index, score, text?}]
Results are best first; relevance_score is the model's activation of its logit (sigmoid for
ms-marco style cross-encoders), `raw_scores` gives the logit. Pairs longer than the model's
max_seq_length are truncated (longest first), as sentence-transformers does.
"""
from __future__ import annotations

import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from torch_xdna.server.registry import ModelEntry
from torch_xdna.server.schemas import APIError, parse
from torch_xdna.server.worker import Job, unmerge


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")       # Cohere/Jina documents may carry other fields
    text: str


class RerankRequest(BaseModel):
    """POST /v1/rerank (Cohere v1/v2, Jina)."""

    model_config = ConfigDict(extra="forbid")
    query: str
    documents: list[str | _Doc]
    model: str | None = None
    top_n: int | None = Field(default=None, ge=1)
    return_documents: bool = False
    max_chunks_per_doc: int | None = None           # Cohere v1; accepted, not used
    rank_fields: list[str] | None = None            # Cohere v1 structured docs: only ["text"]


class TEIRerankRequest(BaseModel):
    """POST /rerank (text-embeddings-inference)."""

    model_config = ConfigDict(extra="forbid")
    query: str
    texts: list[str]
    model: str | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: str = "Right"


def _check(entry: ModelEntry, query: str, docs: list[str], max_inputs: int, param: str) -> None:
    if not query:
        raise APIError(400, "'query' must not be empty.", param="query", code="invalid_value")
    if not docs:
        raise APIError(400, f"'{param}' must not be empty.", param=param, code="invalid_value")
    if len(docs) > max_inputs:
        raise APIError(400, f"'{param}' has {len(docs)} items; at most {max_inputs} per request. "
                            f"Split the request.", param=param, code="too_many_inputs")
    for i, d in enumerate(docs):
        if not d:
            raise APIError(400, f"'{param}[{i}]' is an empty text; every document must contain "
                                f"text.", param=param, code="invalid_value")


async def _scores(srv, request: Request, entry: ModelEntry, query: str, docs: list[str]):
    """(logits, scores, tokens, modeled_us) for every document, run on the device worker."""
    pairs = await run_in_threadpool(entry.tokenizer.encode_pairs, query, docs)
    n_tokens = sum(len(p[0]) for p in pairs)
    if n_tokens > srv.config.max_request_tokens:
        raise APIError(400, f"the request holds {n_tokens} tokens; at most "
                            f"{srv.config.max_request_tokens} per request. Split it.",
                       param="documents", code="too_many_tokens")

    def run_batch(payloads: list[list[Any]]) -> list[tuple[Any, Any, float]]:
        from torch_xdna.engine.embed.embedder import EmbedStats
        model = srv.load(entry)
        stats = EmbedStats()
        logits = model.logits_ids([p for pl in payloads for p in pl], stats)
        scores = model.activate(logits)
        return [(lg, sc, stats.modeled_us)
                for lg, sc in unmerge([len(pl) for pl in payloads], logits, scores)]

    job = Job(batch_key=("rerank", entry.id), batch_fn=srv.npu_job(run_batch), payload=pairs,
              size=len(pairs))
    logits, scores, modeled_us = await srv.wait(srv.submit(job), request)
    srv.metrics.add_tokens(entry.id, "prompt", n_tokens)
    return logits, scores, n_tokens, modeled_us


def _order(logits) -> list[int]:
    return sorted(range(len(logits)), key=lambda i: (-float(logits[i]), i))


def register(app: FastAPI, srv) -> None:
    def headers(modeled_us: float) -> dict[str, str]:
        return {"x-xdna-backend": srv.dev.backend,
                "x-xdna-modeled-npu-ms": f"{modeled_us / 1e3:.3f}"}

    @app.post("/v1/rerank")
    async def rerank(request: Request):
        req: RerankRequest = await parse(request, RerankRequest)
        if req.rank_fields not in (None, ["text"]):
            raise APIError(400, "'rank_fields' other than [\"text\"] is not supported; put the "
                                "text to rank in each document's 'text'.", param="rank_fields",
                           code="invalid_value")
        entry = srv.registry.resolve(req.model, "rerank")
        docs = [d if isinstance(d, str) else d.text for d in req.documents]
        _check(entry, req.query, docs, srv.config.max_inputs, "documents")
        logits, scores, n_tokens, us = await _scores(srv, request, entry, req.query, docs)
        order = _order(logits)[:req.top_n] if req.top_n else _order(logits)
        results = []
        for i in order:
            r: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
            if req.return_documents:
                r["document"] = {"text": docs[i]}
            results.append(r)
        return JSONResponse({"id": str(uuid.uuid4()), "model": entry.id, "results": results,
                             "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                             "meta": {"billed_units": {"search_units": 1}}},
                            headers=headers(us))

    @app.post("/rerank")
    async def rerank_tei(request: Request):
        req: TEIRerankRequest = await parse(request, TEIRerankRequest)
        if req.truncate is False:
            raise APIError(400, "'truncate': false is not supported; pairs longer than the "
                                "model's max_seq_length are always truncated.", param="truncate",
                           code="invalid_value")
        if req.truncation_direction != "Right":
            raise APIError(400, "only truncation_direction 'Right' is supported.",
                           param="truncation_direction", code="invalid_value")
        entry = srv.registry.resolve(req.model, "rerank")
        _check(entry, req.query, req.texts, srv.config.max_inputs, "texts")
        logits, scores, _, us = await _scores(srv, request, entry, req.query, req.texts)
        vals = logits if req.raw_scores else scores
        out = []
        for i in _order(logits):
            r: dict[str, Any] = {"index": i, "score": float(vals[i])}
            if req.return_text:
                r["text"] = req.texts[i]
            out.append(r)
        return JSONResponse(out, headers=headers(us))
