"""OpenAI's model list: /v1/models and /v1/models/{id}, one card per served model (embedding
models add their dimensions and input limit)."""
from __future__ import annotations

from fastapi import FastAPI

from torch_xdna.server.registry import ModelEntry
from torch_xdna.server.schemas import APIError
from torch_xdna.server.state import Server


def model_card(e: ModelEntry, srv: Server | None = None) -> dict:
    card = {"id": e.id, "object": "model", "created": e.created, "owned_by": "torch-xdna",
            "kind": e.kind}
    if e.aliases:
        card["aliases"] = list(e.aliases)
    if e.spec is not None:
        card.update(dimensions=e.spec.dim, max_input_tokens=e.spec.max_seq_length)
    ctx = srv.registry.context_length(e) if srv is not None else None
    if ctx:
        card["max_model_len"] = ctx           # vLLM's field: the context requests are held to
    return card


def register(app: FastAPI, srv: Server) -> None:
    """Add /v1/models and /v1/models/{id} to `app`."""

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card(e, srv)
                                           for e in srv.registry.entries.values()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str):
        e = srv.registry.find(model_id)
        if e is None:
            raise APIError(404, f"The model '{model_id}' does not exist.", param="model",
                           code="model_not_found")
        return model_card(e, srv)
