"""OpenAI /v1/chat/completions and /v1/completions on top of GenerationRun: n choices, tool
calls (server/tools.py), response_format (json_object / json_schema, enforced by a grammar), logprobs,
usage in streams. JSON, or SSE when "stream" is set."""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from torch_xdna.server.chat import GenerationParams
from torch_xdna.server.generation import (GenerationPlan, GenerationRun, OutputSplit, chat_plan,
                                          fim_setup)
from torch_xdna.server.schemas import (APIError, ChatCompletionRequest, CompletionRequest,
                                       NamedToolChoice, ResponseFormat, checked_schema, parse)
from torch_xdna.server.state import Server


def register(app: FastAPI, srv: Server) -> None:
    """Add /v1/chat/completions and /v1/completions to `app`."""

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await chat_completion(srv, request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await text_completion(srv, request)


def base_params(req) -> GenerationParams:
    return GenerationParams(max_tokens=0, temperature=req.temperature, top_p=req.top_p,
                            seed=req.seed, stop=req.stop_list(),
                            presence_penalty=req.presence_penalty,
                            frequency_penalty=req.frequency_penalty,
                            logit_bias=req.bias_pairs(), logprobs=req.top_k_logprobs(), n=req.n,
                            top_k=req.top_k, min_p=req.min_p,
                            repetition_penalty=req.repetition_penalty)


def response_grammar(fmt: ResponseFormat | None):
    """response_format -> engine Grammar (None for text); the schema is checked first (400)."""
    from torch_xdna.engine.llm.constrained import Grammar
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Grammar("json_object")
    return Grammar("json_schema", checked_schema(fmt.json_schema.schema_, "response_format",
                                                 "'response_format.json_schema.schema'"))


async def chat_completion(srv: Server, request: Request):
    req: ChatCompletionRequest = await parse(request, ChatCompletionRequest)
    entry = srv.registry.resolve(req.model, "chat")
    choice = req.tool_choice or ("auto" if req.tools else "none")
    if isinstance(choice, NamedToolChoice):
        choice = choice.function.name
    params = base_params(req)
    params.grammar = response_grammar(req.response_format)
    plan = chat_plan([m.for_template(f"messages[{i}]") for i, m in enumerate(req.messages)],
                     [t.model_dump(exclude_none=True) for t in req.tools or []], choice, params,
                     req.token_limit(), parallel=req.parallel_tool_calls is not False,
                     template_vars=req.chat_template_kwargs)
    return await respond(GenerationRun(srv, request, entry, plan), req, chat=True)


async def text_completion(srv: Server, request: Request):
    req: CompletionRequest = await parse(request, CompletionRequest)
    entry = srv.registry.resolve(req.model, "chat")
    setup = (fim_setup(req.prompt, req.suffix) if req.suffix
             else lambda model, p: model.encode(req.prompt))
    run = GenerationRun(srv, request, entry,
                        GenerationPlan(setup, base_params(req), req.max_tokens, "prompt"))
    return await respond(run, req, chat=False)


# --- logprobs in OpenAI's two shapes --------------------------------------------------------------
def _bytes(s: str) -> list[int]:
    return list(s.encode("utf-8"))


def chat_logprobs(items: list[dict]) -> dict:
    return {"content": [{"token": x["token"], "logprob": x["logprob"], "bytes": _bytes(x["token"]),
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": _bytes(t)}
                                          for t, lp in x["top"]]} for x in items],
            "refusal": None}


def text_logprobs(items: list[dict], offset: int = 0) -> dict:
    offsets, pos = [], offset
    for x in items:
        offsets.append(pos)
        pos += len(x["token"])
    return {"tokens": [x["token"] for x in items], "token_logprobs": [x["logprob"] for x in items],
            "top_logprobs": [{t: lp for t, lp in x["top"]} for x in items],
            "text_offset": offsets}


# --- responses ------------------------------------------------------------------------------------
async def respond(run: GenerationRun, req, chat: bool):
    prompt_tokens = await run.start()
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    model_id = run.entry.id
    want_lp = req.top_k_logprobs() is not None
    info = run.plan.info

    def usage(results) -> dict:
        completion = sum(r.completion_tokens for r in results)
        out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
               "total_tokens": prompt_tokens + completion}
        cached = max((r.cached_tokens for r in results), default=0)
        if cached:                     # OpenAI's field for prompt tokens served from a cache
            out["prompt_tokens_details"] = {"cached_tokens": cached}
        return out

    if not req.stream:
        try:
            texts: dict[int, list[str]] = {}
            lps: dict[int, list[dict]] = {}
            async for ev in run.events_until_end():
                if ev[0] == "delta":
                    texts.setdefault(ev[1], []).append(ev[2])
                    lps.setdefault(ev[1], []).extend(ev[3] or [])
                else:
                    results = ev[1]
        finally:
            run.close("done")
        choices = []
        for i, r in enumerate(results):
            text = "".join(texts.get(i, []))
            lp = lps.get(i, []) if want_lp else None
            if chat:
                reasoning, content, calls = OutputSplit.whole(info, text)
                message: dict[str, Any] = {"role": "assistant", "content": content}
                finish = r.finish_reason
                if calls:
                    message = {"role": "assistant", "content": content.strip() or None,
                               "tool_calls": [c.openai() for c in calls]}
                    finish = "tool_calls"
                if reasoning:             # vLLM's and llama.cpp's field for the think block
                    message["reasoning_content"] = reasoning
                choices.append({"index": i, "message": message,
                                "logprobs": chat_logprobs(lp) if lp is not None else None,
                                "finish_reason": finish})
            else:
                choices.append({"index": i, "text": text,
                                "logprobs": text_logprobs(lp) if lp is not None else None,
                                "finish_reason": r.finish_reason})
        return {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": model_id, "choices": choices,
                "usage": usage(results), "system_fingerprint": None}

    run.stop_watching()
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    obj = "chat.completion.chunk" if chat else "text_completion"
    streams: dict[int, OutputSplit] = {}
    offsets: dict[int, int] = {}

    def chunk(index: int, delta: dict | None = None, text: str | None = None,
              finish: str | None = None, logprobs: dict | None = None) -> str:
        if chat:
            choice = {"index": index, "delta": delta or {}, "logprobs": logprobs,
                      "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs,
                      "finish_reason": finish}
        body = {"id": rid, "object": obj, "created": created, "model": model_id,
                "choices": [choice], "system_fingerprint": None}
        if include_usage:
            body["usage"] = None
        return f"data: {json.dumps(body)}\n\n"

    def delta_chunk(i: int, text: str, items: list[dict] | None) -> str | None:
        lp = None
        if want_lp and items:
            lp = chat_logprobs(items) if chat else text_logprobs(items, offsets.get(i, 0))
        if not chat:
            offsets[i] = offsets.get(i, 0) + len(text)
            return chunk(i, text=text, logprobs=lp)
        reasoning, text = streams.setdefault(i, OutputSplit(info)).feed(text)
        if not text and not reasoning and lp is None:
            return None
        return chunk(i, {"content": text} if not reasoning else
                     {"reasoning_content": reasoning, **({"content": text} if text else {})},
                     logprobs=lp)

    async def sse() -> AsyncIterator[str]:
        try:
            started: set[int] = set()
            if chat:
                started.add(0)
                yield chunk(0, {"role": "assistant", "content": ""})
            async for ev in run.events_until_end():
                if ev[0] == "delta":
                    i = ev[1]
                    if chat and i not in started:
                        started.add(i)
                        yield chunk(i, {"role": "assistant", "content": ""})
                    out = delta_chunk(i, ev[2], ev[3])
                    if out:
                        yield out
                    continue
                results = ev[1]
                for i, r in enumerate(results):
                    if chat and i not in started:
                        yield chunk(i, {"role": "assistant", "content": ""})
                    finish = r.finish_reason
                    split = streams.get(i)
                    if split is not None:
                        reasoning, rest, calls = split.finish()
                        if reasoning:
                            yield chunk(i, {"reasoning_content": reasoning})
                        if rest:
                            yield chunk(i, {"content": rest})
                        if calls:
                            finish = "tool_calls"
                            yield chunk(i, {"tool_calls": [c.openai(k)
                                                           for k, c in enumerate(calls)]})
                    yield chunk(i, {}, finish=finish)
                if include_usage:
                    body = {"id": rid, "object": obj, "created": created, "model": model_id,
                            "choices": [], "usage": usage(results)}
                    yield f"data: {json.dumps(body)}\n\n"
        except APIError as err:          # an error event, then [DONE], as OpenAI streams do
            yield f"data: {json.dumps(err.body())}\n\n"
        finally:
            run.close("client")           # client gone (or done): stop generating
        yield "data: [DONE]\n\n"

    return StreamingResponse(sse(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
