"""/v1/embeddings for image models: inputs are base64 image data URLs
(`data:image/png;base64,...`), decoded and preprocessed on a host thread, embedded on the device
worker (requests for the same model are merged into one batch, as text embeddings are)."""
from __future__ import annotations

import torch
from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from torch_xdna.models.vision import ImageInputError, decode_data_url
from torch_xdna.server.registry import ModelEntry
from torch_xdna.server.schemas import APIError
from torch_xdna.server.worker import Job

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


async def image_embeddings(srv, request: Request, req, entry: ModelEntry) -> JSONResponse:
    from torch_xdna.server.app import encode_vector
    limit = min(MAX_IMAGES, srv.config.max_inputs)
    images = await run_in_threadpool(decode_inputs, req.input, limit)

    def run_batch(payloads: list[list]) -> list[tuple[torch.Tensor, dict]]:
        from torch_xdna.engine.embed.embedder import EmbedStats
        model = srv.load(entry)
        stats = EmbedStats()
        pixels = [model.preprocess(pay) for pay in payloads]
        vecs = model.embed_pixels([p for px in pixels for p in px], stats)
        out, i = [], 0
        for px in pixels:
            out.append((vecs[i:i + len(px)], {"modeled_us": stats.modeled_us,
                                              "merged": len(payloads),
                                              "tokens": sum(model.tokens(p) for p in px)}))
            i += len(px)
        return out

    job = Job(batch_key=("image", entry.id), batch_fn=srv.npu_job(run_batch), payload=images,
              size=len(images))
    vecs, info = await srv.wait(srv.submit(job), request)
    if req.dimensions is not None:
        if req.dimensions > vecs.shape[1]:
            raise APIError(400, f"'dimensions' is {req.dimensions}, but {entry.id} produces "
                                f"{vecs.shape[1]}-dimensional vectors.", param="dimensions",
                           code="invalid_value")
        if req.dimensions < vecs.shape[1]:
            vecs = torch.nn.functional.normalize(vecs[:, :req.dimensions], dim=-1)
    srv.metrics.add_embeddings(entry.id, len(images))
    data = [{"object": "embedding", "index": i, "embedding": encode_vector(v, req.encoding_format)}
            for i, v in enumerate(vecs)]
    n_tokens = info["tokens"]                  # patches + CLS per image
    srv.metrics.add_tokens(entry.id, "prompt", n_tokens)
    headers = {"x-xdna-backend": srv.dev.backend,
               "x-xdna-modeled-npu-ms": f"{info['modeled_us'] / 1e3:.3f}",
               "x-xdna-merged-requests": str(info["merged"])}
    return JSONResponse({"object": "list", "data": data, "model": entry.id,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}},
                        headers=headers)
