"""The Ollama-compatible API, so Ollama clients work unmodified: /api/chat, /api/generate,
/api/embed (and the older /api/embeddings), /api/tags, /api/show, /api/ps, /api/version.

Streaming is Ollama's: newline-delimited JSON objects (application/x-ndjson), "stream" defaulting
to true, the last object carrying done: true, done_reason and the counts and durations (measured
on this host, in nanoseconds). Errors are Ollama's {"error": "message"}. Model names may carry a
tag ("tiny-qwen3:latest" is "tiny-qwen3"). Sampling options follow Ollama's defaults
(temperature 0.8, top_k 40, top_p 0.9) unless the request's "options" set them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from torch_xdna.server.chat import GenerationParams
from torch_xdna.server.schemas import APIError, request_image

API_VERSION = "0.12.0"          # the Ollama API level these routes follow (what /api/version says)
DEFAULTS = {"temperature": 0.8, "top_p": 0.9, "top_k": 40}


class _Lenient(BaseModel):
    # Ollama ignores fields it does not use; so do we (images on a model that takes none are
    # refused by name: server/generation.py's chat_plan)
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class Options(_Lenient):
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    num_predict: int | None = None
    stop: list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0)


class FnCall(_Lenient):
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class OToolCall(_Lenient):
    function: FnCall


class OMessage(_Lenient):
    role: str
    content: str | None = ""
    tool_calls: list[OToolCall] | None = None
    tool_name: str | None = None
    images: list[str] | None = None      # base64 image files (vision-language models)


class _Gen(_Lenient):
    model: str
    stream: bool = True
    format: str | dict | None = None
    options: Options | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    think: bool | None = None            # thinking models: enable_thinking in the template
    keep_alive: str | int | float | None = None     # "5m", 300, 0 (unload now), -1 (never)


class ChatBody(_Gen):
    messages: list[OMessage] = Field(default_factory=list)
    tools: list[dict] | None = None


class GenerateBody(_Gen):
    prompt: str | None = None
    images: list[str] | None = None      # base64 image files (vision-language models)
    system: str | None = None
    raw: bool = False
    suffix: str | None = None            # fill-in-the-middle (coder models with FIM tokens)


class EmbedBody(_Lenient):
    model: str
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)


class EmbeddingsBody(_Lenient):
    model: str
    prompt: str = ""


def keep_alive_s(value) -> float | None:
    """Ollama's keep_alive -> seconds (None: the server's default, resident until evicted;
    a negative value: never unload). Durations as Go writes them: "10s", "5m", "1h", "1h30m"."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    import re
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    parts = re.fullmatch(r"(-?)((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)", text)
    if not parts:
        raise APIError(400, f"invalid 'keep_alive' {value!r}: use a duration such as \"5m\", "
                            f"seconds, 0 (unload now) or -1 (keep loaded)")
    scale = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    total = sum(float(n) * scale[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)",
                                                            parts.group(2)))
    return -total if parts.group(1) else total


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)


async def _body(request: Request, model: type[BaseModel]) -> Any:
    try:
        data = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise APIError(400, f"invalid JSON body ({e})") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data, strict=True)     # "stream": "yes" is not a boolean
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise APIError(400, f"invalid '{where}': {first['msg']}") from None


def resolve(srv, name: str, kind: str):
    """An Ollama model name (optionally "name:tag") -> the registry entry."""
    try:
        return srv.registry.resolve(name, kind)
    except APIError as e:
        base = name.rsplit(":", 1)[0] if ":" in name else None
        if e.status == 404 and base:
            return srv.registry.resolve(base, kind)
        if e.status == 404:
            raise APIError(404, f"model '{name}' not found") from None
        raise


def params_from(body: _Gen) -> tuple[GenerationParams, int | None]:
    """Ollama options -> GenerationParams and the token limit (None: the server's default)."""
    from torch_xdna.engine.llm.constrained import Grammar
    o = body.options or Options()
    pick = lambda k: getattr(o, k) if getattr(o, k) is not None else DEFAULTS[k]  # noqa: E731
    params = GenerationParams(
        max_tokens=0, temperature=pick("temperature"), top_p=pick("top_p"), top_k=pick("top_k"),
        seed=o.seed, stop=list(o.stop or []), presence_penalty=o.presence_penalty or 0.0,
        frequency_penalty=o.frequency_penalty or 0.0,
        repetition_penalty=o.repeat_penalty or 1.0, min_p=o.min_p or 0.0,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None)
    if body.format == "json":
        params.grammar = Grammar("json_object")
    elif isinstance(body.format, dict):
        from torch_xdna.server.schemas import checked_schema
        params.grammar = Grammar("json_schema", checked_schema(body.format, "format"))
    elif body.format not in (None, ""):
        raise APIError(400, f"invalid 'format' {body.format!r}: use \"json\" or a JSON schema")
    limit = o.num_predict if o.num_predict and o.num_predict > 0 else None
    return params, limit


def image_content(images: list[str], text: str, where: str) -> list[dict]:
    """Ollama's base64 `images` and a text as chat content parts: the images first, then the
    text (Ollama's own order); a bad image is a 400 naming where[k]."""
    return [{"type": "image", "image": request_image(b, f"{where}[{k}]", data_url=False)}
            for k, b in enumerate(images)] + [{"type": "text", "text": text}]


def openai_messages(msgs: list[OMessage]) -> list[dict]:
    """Ollama messages -> the OpenAI-shaped dicts tools.render_messages takes."""
    out = []
    for i, m in enumerate(msgs):
        d: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.images:
            d["content"] = image_content(m.images, m.content or "", f"messages[{i}].images")
        if m.tool_calls:
            d["tool_calls"] = [{"id": f"call_{i}_{k}", "type": "function",
                                "function": {"name": c.function.name,
                                             "arguments": c.function.arguments
                                             if isinstance(c.function.arguments, str)
                                             else json.dumps(c.function.arguments)}}
                               for k, c in enumerate(m.tool_calls)]
        if m.role == "tool" and m.tool_name:
            d["name"] = m.tool_name
        out.append(d)
    return out


def _lp(items: list[dict] | None) -> list[dict] | None:
    if not items:
        return None
    return [{"token": x["token"], "logprob": x["logprob"],
             "top_logprobs": [{"token": t, "logprob": lp} for t, lp in x["top"]]} for x in items]


async def _generate(srv, request: Request, body: _Gen, entry, setup, limit, params, chat: bool,
                    info: dict, keep_alive=lambda: None):
    from torch_xdna.server.generation import GenerationPlan, GenerationRun, OutputSplit
    t0 = time.perf_counter_ns()
    run = GenerationRun(srv, request, entry, GenerationPlan(setup, params, limit,
                                                            "messages" if chat else "prompt", info))
    prompt_tokens = await run.start()
    t_first: list[int] = []

    def final(result, extra: dict) -> dict:
        end = time.perf_counter_ns()
        first = t_first[0] if t_first else end
        return {"model": body.model, "created_at": _now(), **extra, "done": True,
                "done_reason": result.finish_reason, "total_duration": end - t0,
                "load_duration": 0, "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": first - t0, "eval_count": result.completion_tokens,
                "eval_duration": end - first}

    def tool_calls(calls) -> list[dict]:
        return [{"function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                for c in calls]

    def piece(text: str, lps=None, thinking: str = "") -> dict:
        d = {"model": body.model, "created_at": _now()}
        if chat:
            d["message"] = {"role": "assistant", "content": text,
                            **({"thinking": thinking} if thinking else {})}
        else:
            d["response"] = text
            if thinking:
                d["thinking"] = thinking
        d["done"] = False
        if lps:
            d["logprobs"] = _lp(lps)
        return d

    if not body.stream:
        parts, lps, result = [], [], None
        try:
            async for ev in run.events_until_end():
                if ev[0] == "delta":
                    if not t_first:
                        t_first.append(time.perf_counter_ns())
                    parts.append(ev[2])
                    lps += ev[3] or []
                else:
                    result = ev[1][0]
        finally:
            run.close("done")
            keep_alive()
        thinking, text, calls = OutputSplit.whole(info, "".join(parts))
        extra: dict[str, Any]
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message = {"role": "assistant", "content": text.strip(),
                           "tool_calls": tool_calls(calls)}
            if thinking:
                message["thinking"] = thinking
            extra = {"message": message}
        else:
            extra = {"response": text, **({"thinking": thinking} if thinking else {})}
        if lps:
            extra["logprobs"] = _lp(lps)
        return final(result, extra)

    run.stop_watching()

    async def ndjson() -> AsyncIterator[str]:
        split = OutputSplit(info)
        try:
            async for ev in run.events_until_end():
                if ev[0] == "delta":
                    if not t_first:
                        t_first.append(time.perf_counter_ns())
                    thinking, text = split.feed(ev[2])
                    if text or thinking or ev[3]:
                        yield json.dumps(piece(text, ev[3], thinking)) + "\n"
                    continue
                result = ev[1][0]
                extra: dict[str, Any] = ({"message": {"role": "assistant", "content": ""}}
                                         if chat else {"response": ""})
                thinking, rest, calls = split.finish()
                if (rest.strip() if calls else rest) or thinking:
                    yield json.dumps(piece(rest, None, thinking)) + "\n"
                if calls:
                    yield json.dumps({**piece(""), "message": {
                        "role": "assistant", "content": "",
                        "tool_calls": tool_calls(calls)}}) + "\n"
                yield json.dumps(final(result, extra)) + "\n"
        except APIError as e:                     # Ollama streams end with an error object
            yield json.dumps({"error": e.message}) + "\n"
        finally:
            run.close("client")
            keep_alive()

    return StreamingResponse(ndjson(), media_type="application/x-ndjson")


def register(app: FastAPI, srv) -> None:
    def guarded(fn):
        async def handler(request: Request):
            try:
                return await fn(request)
            except APIError as e:
                return _error(e)
        handler.__name__ = fn.__name__
        return handler

    @app.get("/api/version")
    async def version():
        return {"version": API_VERSION}

    timers: dict[str, Any] = {}           # model id -> its pending keep_alive unload
    expiry: dict[str, float] = {}         # model id -> when it unloads (epoch seconds)

    def unload_now(entry_id: str) -> None:
        from torch_xdna.server.worker import Job
        timers.pop(entry_id, None)
        expiry.pop(entry_id, None)
        try:
            srv.submit(Job(fn=lambda: srv.registry.unload(entry_id)))
        except APIError:                   # queue full or shutting down: it stays loaded
            pass

    def keep_alive_for(entry, body: _Gen):
        """What to do with the model after this request (Ollama's keep_alive)."""
        seconds = keep_alive_s(body.keep_alive)

        def after() -> None:
            if seconds is None:
                return
            old = timers.pop(entry.id, None)
            if old is not None:
                old.cancel()
            expiry.pop(entry.id, None)
            if seconds == 0:
                unload_now(entry.id)
            elif seconds > 0:
                timers[entry.id] = asyncio.get_running_loop().call_later(
                    seconds, unload_now, entry.id)
                expiry[entry.id] = time.time() + seconds
        return after

    async def load_or_unload(request: Request, body: _Gen, entry, empty: dict) -> dict:
        """Ollama: a request without a prompt loads the model, or with keep_alive 0 unloads it."""
        if keep_alive_s(body.keep_alive) == 0:
            keep_alive_for(entry, body)()
            return {"model": body.model, "created_at": _now(), **empty, "done": True,
                    "done_reason": "unload"}
        await srv.wait(srv.submit(_load_job(srv, entry)), request)
        keep_alive_for(entry, body)()
        return {"model": body.model, "created_at": _now(), **empty, "done": True,
                "done_reason": "load"}

    @guarded
    async def chat(request: Request):
        from torch_xdna.server.generation import chat_plan
        body: ChatBody = await _body(request, ChatBody)
        entry = resolve(srv, body.model, "chat")
        if not body.messages:
            return await load_or_unload(request, body, entry,
                                        {"message": {"role": "assistant", "content": ""}})
        params, limit = params_from(body)
        tools = [t for t in body.tools or [] if isinstance(t.get("function"), dict)]
        plan = chat_plan(openai_messages(body.messages), tools, "auto" if tools else "none",
                         params, limit, template_vars=None if body.think is None
                         else {"enable_thinking": body.think})
        return await _generate(srv, request, body, entry, plan.setup, limit, params, True,
                               plan.info, keep_alive_for(entry, body))

    @guarded
    async def generate(request: Request):
        from torch_xdna.server.generation import chat_plan, fim_setup
        body: GenerateBody = await _body(request, GenerateBody)
        entry = resolve(srv, body.model, "chat")
        if not body.prompt:
            return await load_or_unload(request, body, entry, {"response": ""})
        params, limit = params_from(body)
        if body.images and (body.raw or body.suffix):
            raise APIError(400, "images need the chat template; drop 'raw' and 'suffix'",
                           param="images", code="invalid_value")
        msgs = ([{"role": "system", "content": body.system}] if body.system else []) + \
            [{"role": "user", "content": image_content(body.images, body.prompt, "images")
              if body.images else body.prompt}]
        plan = chat_plan(msgs, [], "none", params, limit, template_vars=None
                         if body.think is None else {"enable_thinking": body.think})
        info: dict = {"names": set()}

        def setup(model, p):
            if body.suffix:
                return fim_setup(body.prompt, body.suffix)(model, p)
            if body.raw or not getattr(model, "chat_template", "x"):
                return model.encode(body.prompt)
            ids = plan.setup(model, p)
            info.update(plan.info)
            return ids
        return await _generate(srv, request, body, entry, setup, limit, params, False, info,
                               keep_alive_for(entry, body))

    @app.get("/")
    @app.head("/")
    async def root():                     # what Ollama answers (clients probe it)
        from fastapi.responses import PlainTextResponse
        return PlainTextResponse("Ollama is running")

    @guarded
    async def embed(request: Request):
        body: EmbedBody = await _body(request, EmbedBody)
        entry = resolve(srv, body.model, "embedding")
        t0 = time.perf_counter_ns()
        vecs, n_tokens = await _embed(srv, request, entry, body.input, body.truncate)
        if body.dimensions is not None and body.dimensions < vecs.shape[1]:
            import torch
            vecs = torch.nn.functional.normalize(vecs[:, :body.dimensions], dim=-1)
        return {"model": body.model, "embeddings": vecs.tolist(),
                "total_duration": time.perf_counter_ns() - t0, "load_duration": 0,
                "prompt_eval_count": n_tokens}

    @guarded
    async def embeddings(request: Request):
        body: EmbeddingsBody = await _body(request, EmbeddingsBody)
        entry = resolve(srv, body.model, "embedding")
        if not body.prompt:
            return {"embedding": []}
        vecs, _ = await _embed(srv, request, entry, body.prompt, True)
        return {"embedding": vecs[0].tolist()}

    @app.get("/api/tags")
    async def tags():
        return {"models": [_card(e) for e in srv.registry.entries.values()]}

    @app.get("/api/ps")
    async def ps():
        loaded = set(srv.registry.loaded_ids())

        def expires(e) -> str | None:
            at = expiry.get(e.id)
            return None if at is None else datetime.fromtimestamp(at, timezone.utc).isoformat()
        return {"models": [{**_card(e), "expires_at": expires(e), "size_vram": 0}
                           for e in srv.registry.entries.values() if e.id in loaded]}

    @guarded
    async def show(request: Request):
        data = json.loads(await request.body() or b"{}")
        name = data.get("model") or data.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(400, "'model' is required")
        entry = _any_entry(srv, name)
        return _show(srv, entry)

    for path, fn in (("/api/chat", chat), ("/api/generate", generate), ("/api/embed", embed),
                     ("/api/embeddings", embeddings), ("/api/show", show)):
        app.add_api_route(path, fn, methods=["POST"])


def _load_job(srv, entry):
    from torch_xdna.server.worker import Job
    return Job(fn=srv.npu_job(lambda: (srv.load(entry), None)[1]))


async def _embed(srv, request, entry, inp, truncate: bool):
    from torch_xdna.engine.embed.embedder import EmbedStats
    from torch_xdna.server.routes.embeddings import prompt_skip, tokenize_inputs
    from torch_xdna.server.worker import Job
    config = dataclasses.replace(srv.config, truncate=truncate)
    from starlette.concurrency import run_in_threadpool
    seqs = await run_in_threadpool(tokenize_inputs, entry, inp, config)

    def work():
        return srv.load(entry).embed_ids(seqs, EmbedStats(), pool_skip=prompt_skip(entry, inp))
    vecs = await srv.wait(srv.submit(Job(fn=srv.npu_job(work))), request)
    n = sum(len(s) for s in seqs)
    srv.metrics.add_tokens(entry.id, "prompt", n)
    srv.metrics.add_embeddings(entry.id, len(seqs))
    return vecs, n


def _any_entry(srv, name: str):
    reg = srv.registry
    for n in (name, name.rsplit(":", 1)[0]):
        e = reg.entries.get(n) or next((x for x in reg.entries.values() if n in x.aliases), None)
        if e is not None:
            return e
    raise APIError(404, f"model '{name}' not found")


def _config(entry) -> dict:
    try:
        return json.loads((entry.path / "config.json").read_text()) if entry.path else {}
    except (OSError, ValueError):
        return {}


def _card(entry) -> dict:
    cfg = _config(entry)
    size = sum(f.stat().st_size for f in entry.path.glob("*.safetensors")) if entry.path else 0
    modified = datetime.fromtimestamp(entry.created, timezone.utc).isoformat()
    family = cfg.get("model_type", "bert" if entry.kind == "embedding" else "unknown")
    return {"name": entry.id, "model": entry.id, "modified_at": modified, "size": size,
            "digest": f"{abs(hash((entry.id, str(entry.path)))):016x}",
            "details": {"parent_model": "", "format": "safetensors", "family": family,
                        "families": [family], "parameter_size": "",
                        "quantization_level": "BF16"}}


def _show(srv, entry) -> dict:
    cfg = _config(entry)
    card = _card(entry)
    arch = card["details"]["family"]
    info: dict[str, Any] = {"general.architecture": arch}
    for k_cfg, k_ollama in (("max_position_embeddings", "context_length"),
                            ("hidden_size", "embedding_length"),
                            ("num_hidden_layers", "block_count")):
        if k_cfg in cfg:
            info[f"{arch}.{k_ollama}"] = cfg[k_cfg]
    ctx = srv.registry.context_length(entry)
    if ctx:                               # the one the server holds requests to
        info[f"{arch}.context_length"] = ctx
    template = ""
    caps = ["embedding"] if entry.kind == "embedding" else ["completion"]
    if entry.kind == "chat" and entry.path is not None:
        try:
            tc = json.loads((entry.path / "tokenizer_config.json").read_text())
            template = tc.get("chat_template") or ""
            template = template if isinstance(template, str) else ""
        except (OSError, ValueError):
            pass
        caps.append("tools")            # every chat model: native template or prompt convention
    return {"modelfile": "", "parameters": "", "template": template, "license": "",
            "details": card["details"], "model_info": info, "capabilities": caps,
            "modified_at": card["modified_at"]}
