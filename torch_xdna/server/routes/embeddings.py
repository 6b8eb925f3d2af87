"""/v1/embeddings: text inputs (strings or token ids, tokenized on a host thread and length-checked)
and, for image models, base64 image data URLs (`data:image/png;base64,...`, decoded and
preprocessed on a host thread). Either way, requests for the same model that wait together are
merged into one device batch (server/worker.py); each gets its own rows back."""
from __future__ import annotations

import base64

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from torch_xdna.models.vision import ImageInputError, decode_data_url
from torch_xdna.server.config import ServerConfig
from torch_xdna.server.registry import ModelEntry
from torch_xdna.server.schemas import APIError, EmbeddingRequest, parse
from torch_xdna.server.state import Server
from torch_xdna.server.worker import Job, unmerge

MAX_IMAGES = 256                      # images per request


def decode_inputs(inp, limit: int) -> list:
    """Request input -> PIL images (400 naming the bad item)."""
    items = [inp] if isinstance(inp, str) else inp
    if not isinstance(items, list) or not items or not all(isinstance(x, str) for x in items):
        raise APIError(400, "This is an image embedding model: 'input' must be a base64 image "
                            "data URL ('data:image/png;base64,...') or a list of them.",
                       param="input", code="invalid_input")
    if len(items) > limit:
        raise APIError(400, f"'input' has {len(items)} images; at most {limit} per request.",
                       param="input", code="too_many_inputs")
    try:
        return [decode_data_url(x, f"input[{i}]") for i, x in enumerate(items)]
    except ImageInputError as e:
        raise APIError(400, str(e), param="input", code="invalid_image") from None


def register(app: FastAPI, srv: Server) -> None:
    """Add /v1/embeddings to `app`."""

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        req: EmbeddingRequest = await parse(request, EmbeddingRequest)
        entry = srv.registry.resolve(req.model, ("embedding", "image"))
        if entry.kind == "image":
            return await image_embeddings(srv, request, req, entry)
        return await text_embeddings(srv, request, req, entry)


async def text_embeddings(srv: Server, request: Request, req: EmbeddingRequest,
                          entry: ModelEntry) -> JSONResponse:
    if req.dimensions is not None and req.dimensions > entry.spec.dim:
        raise APIError(400, f"'dimensions' is {req.dimensions}, but {entry.id} produces "
                            f"{entry.spec.dim}-dimensional vectors.", param="dimensions",
                       code="invalid_value")
    seqs = await run_in_threadpool(tokenize_inputs, entry, req.input, srv.config)
    skip = prompt_skip(entry, req.input)

    def run_batch(payloads: list[list[list[int]]]) -> list[tuple[torch.Tensor, dict]]:
        from torch_xdna.engine.embed.embedder import EmbedStats
        model = srv.load(entry)
        stats = EmbedStats()
        vecs = model.embed_ids([s for p in payloads for s in p], stats, pool_skip=skip)
        return [(v, {"modeled_us": stats.modeled_us, "merged": len(payloads)})
                for v, in unmerge([len(p) for p in payloads], vecs)]

    # requests merge only with others whose pooling leaves out the same prompt tokens
    job = Job(batch_key=("embed", entry.id, skip), batch_fn=srv.npu_job(run_batch), payload=seqs,
              size=len(seqs))
    vecs, info = await srv.wait(srv.submit(job), request)
    return embedding_response(srv, req, entry, vecs, sum(len(s) for s in seqs), info)


async def image_embeddings(srv: Server, request: Request, req: EmbeddingRequest,
                           entry: ModelEntry) -> JSONResponse:
    limit = min(MAX_IMAGES, srv.config.max_inputs)
    images = await run_in_threadpool(decode_inputs, req.input, limit)

    def run_batch(payloads: list[list]) -> list[tuple[torch.Tensor, dict]]:
        from torch_xdna.engine.embed.embedder import EmbedStats
        model = srv.load(entry)
        stats = EmbedStats()
        pixels = [model.preprocess(pay) for pay in payloads]
        vecs = model.embed_pixels([p for px in pixels for p in px], stats)
        return [(v, {"modeled_us": stats.modeled_us, "merged": len(payloads),
                     "tokens": sum(model.tokens(p) for p in px)})
                for (v,), px in zip(unmerge([len(px) for px in pixels], vecs), pixels)]

    job = Job(batch_key=("image", entry.id), batch_fn=srv.npu_job(run_batch), payload=images,
              size=len(images))
    vecs, info = await srv.wait(srv.submit(job), request)
    if req.dimensions is not None and req.dimensions > vecs.shape[1]:
        raise APIError(400, f"'dimensions' is {req.dimensions}, but {entry.id} produces "
                            f"{vecs.shape[1]}-dimensional vectors.", param="dimensions",
                       code="invalid_value")
    return embedding_response(srv, req, entry, vecs, info["tokens"], info)  # patches + CLS


def embedding_response(srv: Server, req: EmbeddingRequest, entry: ModelEntry,
                       vecs: torch.Tensor, n_tokens: int, info: dict) -> JSONResponse:
    """OpenAI's embeddings list (cut to `dimensions` and renormalized when asked), counted in the
    metrics, with the (merged) batch's NPU time in the x-xdna-* headers."""
    if req.dimensions is not None and req.dimensions < vecs.shape[1]:
        vecs = torch.nn.functional.normalize(vecs[:, :req.dimensions], dim=-1)
    srv.metrics.add_tokens(entry.id, "prompt", n_tokens)
    srv.metrics.add_embeddings(entry.id, len(vecs))
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
            for i, v in enumerate(vecs)]
    headers = {"x-xdna-backend": srv.dev.backend,
               "x-xdna-modeled-npu-ms": f"{info['modeled_us'] / 1e3:.3f}",
               "x-xdna-merged-requests": str(info["merged"])}
    return JSONResponse({"object": "list", "data": data, "model": entry.id,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}},
                        headers=headers)


def default_prompt(entry: ModelEntry) -> str:
    """The model's default prompt (config_sentence_transformers.json default_prompt_name), which
    sentence-transformers prepends to every text input; '' for none."""
    st = getattr(entry.spec, "sentence", None)
    return dict(st.prompts).get(st.default_prompt_name, "") if st and st.default_prompt_name else ""


def prompt_skip(entry: ModelEntry, inp) -> int:
    """Prompt tokens the pooling leaves out (include_prompt=False) for this request's inputs:
    text inputs carry the default prompt; token-id inputs carry none."""
    st = getattr(entry.spec, "sentence", None)
    texts = isinstance(inp, str) or (isinstance(inp, list) and inp and isinstance(inp[0], str))
    if not texts or st is None or st.include_prompt:
        return 0
    return entry.tokenizer.prompt_length(default_prompt(entry))


def tokenize_inputs(entry: ModelEntry, inp, config: ServerConfig) -> list[list[int]]:
    """Request input -> model inputs with special tokens, length-checked (400 on violations)."""
    tok, spec = entry.tokenizer, entry.spec
    if isinstance(inp, str):
        inp = [inp]
    if not inp:
        raise APIError(400, "'input' must not be empty.", param="input", code="invalid_value")
    if isinstance(inp[0], int):
        inp = [inp]
    if len(inp) > config.max_inputs:
        raise APIError(400, f"'input' has {len(inp)} items; at most {config.max_inputs} inputs "
                            f"per request. Split the request.", param="input",
                       code="too_many_inputs")
    if isinstance(inp[0], str):
        for i, t in enumerate(inp):
            if not t:
                raise APIError(400, f"'input[{i}]' is an empty string; every input must contain "
                                    f"text.", param="input", code="invalid_value")
        prefix = default_prompt(entry)
        seqs = tok.encode([prefix + t for t in inp] if prefix else inp)
    else:
        seqs = []
        for i, ids in enumerate(inp):
            if not ids:
                raise APIError(400, f"'input[{i}]' is an empty token array.", param="input",
                               code="invalid_value")
            bad = [t for t in ids if not 0 <= t < spec.vocab]
            if bad:
                raise APIError(400, f"'input[{i}]' holds token id {bad[0]}, outside {entry.id}'s "
                                    f"vocabulary [0, {spec.vocab}).", param="input",
                               code="invalid_value")
            seqs.append(tok.wrap(ids))
    limit = spec.max_seq_length
    for i, s in enumerate(seqs):
        if len(s) > limit:
            if config.truncate:
                seqs[i] = tok.truncate(s)
                continue
            raise APIError(400, f"'input[{i}]' is {len(s)} tokens long; {entry.id} accepts at most "
                                f"{limit} tokens per input (special tokens included). Shorten or "
                                f"split it (or start the server with --truncate).", param="input",
                           code="context_length_exceeded")
    total = sum(len(s) for s in seqs)
    if total > config.max_request_tokens:
        raise APIError(400, f"the request holds {total} tokens; at most "
                            f"{config.max_request_tokens} per request. Split it.", param="input",
                       code="too_many_tokens")
    return seqs


def encode_vector(v: torch.Tensor, fmt: str) -> list[float] | str:
    """One vector as OpenAI sends it: a float list, or base64 of its little-endian float32 bytes."""
    if fmt == "base64":
        return base64.b64encode(v.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()).decode()
    return v.tolist()
