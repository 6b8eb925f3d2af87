"""Anthropic's Messages API, so Anthropic clients (the `anthropic` SDKs, Claude Code pointed at
ANTHROPIC_BASE_URL) work unmodified: POST /v1/messages (text, system, multi-turn, tool_use /
tool_result, thinking blocks, streaming events) and /v1/messages/count_tokens.

The request is translated to the OpenAI-shaped messages and tools every chat API shares and run
on the same path (server/generation.py's chat_plan and GenerationRun). The key may come as
`x-api-key` (the guard accepts it); `anthropic-version` is accepted whatever its value. Errors are
Anthropic's {"type": "error", "error": {"type", "message"}} (server/errors.py).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from torch_xdna.server.chat import GenerationParams
from torch_xdna.server.errors import anthropic_error
from torch_xdna.server.generation import GenerationRun, OutputSplit, chat_plan
from torch_xdna.server.schemas import APIError, parse
from torch_xdna.server.state import Server
from torch_xdna.server.worker import Job


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class AMessage(_Body):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class ATool(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: Literal["custom"] | None = None
    cache_control: dict | None = None


class CountRequest(_Body):
    """POST /v1/messages/count_tokens."""

    model: str
    messages: list[AMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ATool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesRequest(CountRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


def _text(content: Any, where: str) -> str:
    """A string or a list of text blocks -> their text (anything else: 400)."""
    if isinstance(content, str):
        return content
    parts = []
    for b in content or []:
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise APIError(400, f"{where}: only text blocks are supported here, got {kind!r}",
                           param=where)
        parts.append(b["text"])
    return "".join(parts)


def openai_messages(req: CountRequest) -> list[dict]:
    """Anthropic system + messages -> OpenAI-shaped messages (tool_use -> assistant tool_calls,
    tool_result -> role "tool"; thinking blocks of earlier turns are dropped, as Qwen3's own
    template drops them)."""
    out: list[dict] = []
    system = _text(req.system, "system") if req.system is not None else ""
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}
    for i, m in enumerate(req.messages):
        blocks = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else m.content
        text, calls, results = [], [], []
        for b in blocks:
            kind = b.get("type")
            if kind == "text":
                text.append(str(b.get("text", "")))
            elif kind == "tool_use" and m.role == "assistant":
                names[str(b.get("id"))] = str(b.get("name"))
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"),
                                           "arguments": json.dumps(b.get("input") or {})}})
            elif kind == "tool_result" and m.role == "user":
                body = _text(b.get("content") or "", f"messages.{i}.content.tool_result")
                results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                                "name": names.get(str(b.get("tool_use_id"))),
                                "content": ("Error: " + body) if b.get("is_error") else body})
            elif kind in ("thinking", "redacted_thinking"):
                continue
            else:
                raise APIError(400, f"messages.{i}.content: {kind!r} blocks are not supported "
                                    f"by this server (text, tool_use, tool_result, thinking)",
                               param="messages")
        out += results
        if m.role == "assistant":
            out.append({"role": "assistant", "content": "".join(text), **(
                {"tool_calls": calls} if calls else {})})
        elif text or not results:
            out.append({"role": "user", "content": "".join(text)})
    return out


def _tools(req: CountRequest) -> tuple[list[dict], Any, bool]:
    """(OpenAI tools, tool choice, parallel) of the request."""
    tools = [{"type": "function", "function": {
        "name": t.name, **({"description": t.description} if t.description else {}),
        "parameters": t.input_schema}} for t in req.tools or []]
    tc = req.tool_choice or {"type": "auto"}
    kind = tc.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise APIError(400, f"tool_choice.type must be auto, any, tool or none, got {kind!r}",
                       param="tool_choice")
    choice: Any = {"auto": "auto", "any": "required", "none": "none"}.get(kind, tc.get("name"))
    if kind == "tool" and choice not in {t["function"]["name"] for t in tools}:
        raise APIError(400, f"tool_choice names {choice!r}, which is not among tools",
                       param="tool_choice")
    if kind in ("any", "tool") and not tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    return tools, (choice if tools else "none"), not tc.get("disable_parallel_tool_use", False)


def _template_vars(req: CountRequest) -> dict:
    kind = (req.thinking or {}).get("type")
    return {"enable_thinking": kind == "enabled"} if kind in ("enabled", "disabled") else {}


def _plan(req: CountRequest, params: GenerationParams, max_tokens: int | None):
    tools, choice, parallel = _tools(req)
    return chat_plan(openai_messages(req), tools, choice, params, max_tokens, parallel,
                     _template_vars(req))


def register(app: FastAPI, srv: Server) -> None:
    """Add /v1/messages and /v1/messages/count_tokens to `app`."""

    @app.post("/v1/messages")
    async def messages(request: Request):
        try:
            return await create_message(srv, request)
        except APIError as e:
            return JSONResponse(anthropic_error(e), status_code=e.status, headers=e.headers)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        try:
            req: CountRequest = await parse(request, CountRequest)
            entry = srv.registry.resolve(req.model, "chat")
            plan = _plan(req, GenerationParams(max_tokens=1), None)

            def work() -> int:
                return len(plan.setup(srv.load(entry), plan.params))
            n = await srv.wait(srv.submit(Job(fn=srv.npu_job(work))), request)
            return {"input_tokens": n}
        except APIError as e:
            return JSONResponse(anthropic_error(e), status_code=e.status, headers=e.headers)


def _stop_reason(result, calls: list) -> tuple[str, str | None]:
    if calls:
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.stop_sequence:
        return "stop_sequence", result.stop_sequence
    return "end_turn", None


def _usage(prompt: int, result) -> dict:
    cached = result.cached_tokens
    return {"input_tokens": prompt - cached, "output_tokens": result.completion_tokens,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def _tool_block(call) -> dict:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": json.loads(call.arguments)}


async def create_message(srv: Server, request: Request):
    req: MessagesRequest = await parse(request, MessagesRequest)
    entry = srv.registry.resolve(req.model, "chat")
    params = GenerationParams(max_tokens=0, temperature=req.temperature, top_p=req.top_p,
                              top_k=req.top_k, stop=list(req.stop_sequences or []),
                              stops_here=bool(req.stop_sequences))
    run = GenerationRun(srv, request, entry, _plan(req, params, req.max_tokens))
    prompt_tokens = await run.start()
    mid = "msg_" + uuid.uuid4().hex[:24]
    info = run.plan.info
    head = {"id": mid, "type": "message", "role": "assistant", "model": req.model}

    if not req.stream:
        text, result = await run.text()
        reasoning, content, calls = OutputSplit.whole(info, text)
        blocks: list[dict] = []
        if reasoning:
            blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if content.strip() or not (calls or reasoning):
            blocks.append({"type": "text", "text": content})     # as streamed
        blocks += [_tool_block(c) for c in calls]
        reason, seq = _stop_reason(result, calls)
        return {**head, "content": blocks, "stop_reason": reason, "stop_sequence": seq,
                "usage": _usage(prompt_tokens, result)}

    run.stop_watching()
    return StreamingResponse(_events(run, head, prompt_tokens), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(kind: str, body: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n"


async def _events(run: GenerationRun, head: dict, prompt_tokens: int) -> AsyncIterator[str]:
    """Anthropic's stream: message_start, then per content block start / deltas / stop,
    message_delta (stop reason, output tokens), message_stop."""
    split = OutputSplit(run.plan.info)
    block = {"index": -1, "type": None}

    def switch(kind: str, start: dict) -> list[str]:
        out = []
        if block["type"] is not None:
            out.append(_sse("content_block_stop", {"index": block["index"]}))
        block["index"] += 1
        block["type"] = kind
        out.append(_sse("content_block_start", {"index": block["index"], "content_block": start}))
        return out

    def emit(reasoning: str, content: str) -> list[str]:
        out = []
        if reasoning:
            if block["type"] != "thinking":
                out += switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(_sse("content_block_delta", {"index": block["index"], "delta": {
                "type": "thinking_delta", "thinking": reasoning}}))
        if content:
            if block["type"] != "text":
                out += switch("text", {"type": "text", "text": ""})
            out.append(_sse("content_block_delta", {"index": block["index"], "delta": {
                "type": "text_delta", "text": content}}))
        return out

    try:
        yield _sse("message_start", {"message": {
            **head, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})
        yield _sse("ping", {})
        async for ev in run.events_until_end():
            if ev[0] == "delta":
                for line in emit(*split.feed(ev[2])):
                    yield line
                continue
            result = ev[1][0]
            reasoning, rest, calls = split.finish()
            for line in emit(reasoning, rest if (rest.strip() or not calls) else ""):
                yield line
            for c in calls:
                tool = _tool_block(c)
                for line in switch("tool_use", {**tool, "input": {}}):
                    yield line
                yield _sse("content_block_delta", {"index": block["index"], "delta": {
                    "type": "input_json_delta", "partial_json": json.dumps(tool["input"])}})
            if block["type"] is None:                # an empty answer is one empty text block
                for line in switch("text", {"type": "text", "text": ""}):
                    yield line
            yield _sse("content_block_stop", {"index": block["index"]})
            reason, seq = _stop_reason(result, calls)
            yield _sse("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": seq},
                                         "usage": {"output_tokens": result.completion_tokens}})
            yield _sse("message_stop", {})
    except APIError as err:
        yield _sse("error", {"error": anthropic_error(err)["error"]})
    finally:
        run.close("client")
