"""OpenAI's Responses API (POST /v1/responses), which newer OpenAI agents use: text and message
input, instructions, function tools and their outputs, reasoning items split from `<think>`
blocks, JSON or the streamed events (response.created ... response.completed).

Stateless: `previous_response_id` needs stored responses, which this server does not keep (400
naming the fix: send the whole conversation as `input`). Runs on the chat path every API shares
(server/generation.py's chat_plan and GenerationRun).
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from torch_xdna.server.chat import GenerationParams
from torch_xdna.server.generation import GenerationRun, OutputSplit, chat_plan
from torch_xdna.server.schemas import APIError, ResponseFormat, parse
from torch_xdna.server.state import Server


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class FunctionTool(_Body):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    out = []
    for part in content or []:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise APIError(400, f"'input' content of type {kind!r} is not supported (text only)",
                           param="input")
        out.append(str(part.get("text", "")))
    return "".join(out)


def openai_messages(req: ResponsesRequest) -> list[dict]:
    """Responses input items -> OpenAI-shaped chat messages."""
    out: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    names: dict[str, str] = {}
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"'input' message role {role!r} is not one of user, "
                                    f"assistant, system, developer", param="input")
            out.append({"role": role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            names[str(item.get("call_id"))] = str(item.get("name"))
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "name": names.get(str(item.get("call_id"))),
                        "content": _text(item.get("output"))})
        elif kind != "reasoning":
            raise APIError(400, f"'input' items of type {kind!r} are not supported (message, "
                                f"function_call, function_call_output, reasoning)", param="input")
    return out


def _choice(req: ResponsesRequest) -> Any:
    tc = req.tool_choice
    if not req.tools:
        return "none"
    if tc is None or tc in ("auto", "none", "required"):
        return tc or "auto"
    if isinstance(tc, dict) and tc.get("type") == "function" and tc.get("name"):
        return tc["name"]
    raise APIError(400, "'tool_choice' must be auto, none, required or {type: function, name}",
                   param="tool_choice")


def _grammar(req: ResponsesRequest):
    fmt = (req.text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    from torch_xdna.server.routes.openai_chat import response_grammar
    if fmt.get("type") == "json_schema":
        return response_grammar(ResponseFormat(type="json_schema", json_schema={
            "name": fmt.get("name", "response"), "schema": fmt.get("schema") or {}}))
    return response_grammar(ResponseFormat(type=fmt.get("type")))


def register(app: FastAPI, srv: Server) -> None:
    """Add /v1/responses to `app`."""

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await create_response(srv, request)


async def create_response(srv: Server, request: Request):
    req: ResponsesRequest = await parse(request, ResponsesRequest)
    if req.previous_response_id:
        raise APIError(400, "this server keeps no responses, so 'previous_response_id' cannot be "
                            "used; send the whole conversation as 'input'",
                       param="previous_response_id", code="unsupported_parameter")
    entry = srv.registry.resolve(req.model, "chat")
    params = GenerationParams(max_tokens=0, temperature=req.temperature, top_p=req.top_p,
                              top_k=req.top_k, min_p=req.min_p, seed=req.seed,
                              grammar=_grammar(req))
    tools = [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
             for t in req.tools or []]
    plan = chat_plan(openai_messages(req), tools, _choice(req), params, req.max_output_tokens,
                     req.parallel_tool_calls is not False, req.chat_template_kwargs)
    run = GenerationRun(srv, request, entry, plan)
    prompt_tokens = await run.start()
    resp = {"id": "resp_" + uuid.uuid4().hex[:24], "object": "response",
            "created_at": int(time.time()), "status": "in_progress", "model": entry.id,
            "output": [], "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "temperature": req.temperature,
            "top_p": req.top_p, "tool_choice": req.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "parallel_tool_calls": req.parallel_tool_calls is not False, "error": None,
            "incomplete_details": None, "metadata": req.metadata or {}, "text": req.text or {
                "format": {"type": "text"}}, "usage": None, "store": False}
    if not req.stream:
        text, result = await run.text()
        reasoning, content, calls = OutputSplit.whole(run.plan.info, text)
        return _final(resp, result, prompt_tokens, _items(reasoning, content, calls))
    run.stop_watching()
    return StreamingResponse(_events(run, resp, prompt_tokens), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _reasoning_item(text: str) -> dict:
    return {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex[:24], "summary": [],
            "content": [{"type": "reasoning_text", "text": text}], "status": "completed"}


def _message_item(text: str, mid: str | None = None, status: str = "completed") -> dict:
    return {"type": "message", "id": mid or "msg_" + uuid.uuid4().hex[:24], "status": status,
            "role": "assistant", "content": [{"type": "output_text", "text": text,
                                              "annotations": [], "logprobs": []}]}


def _call_item(call) -> dict:
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"),
            "call_id": call.id, "name": call.name, "arguments": call.arguments,
            "status": "completed"}


def _items(reasoning: str, content: str, calls: list) -> list[dict]:
    out = [_reasoning_item(reasoning)] if reasoning else []
    if content.strip() or not calls:
        out.append(_message_item(content))
    return out + [_call_item(c) for c in calls]


def _final(resp: dict, result, prompt_tokens: int, output: list[dict]) -> dict:
    done = result.finish_reason != "length" or any(o["type"] == "function_call" for o in output)
    return {**resp, "status": "completed" if done else "incomplete", "output": output,
            "incomplete_details": None if done else {"reason": "max_output_tokens"},
            "usage": {"input_tokens": prompt_tokens,
                      "input_tokens_details": {"cached_tokens": result.cached_tokens},
                      "output_tokens": result.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt_tokens + result.completion_tokens}}


async def _events(run: GenerationRun, resp: dict, prompt_tokens: int) -> AsyncIterator[str]:
    """response.created / in_progress, then the message item's text deltas as they come; the
    reasoning and function-call items once the output is complete; response.completed."""
    seq = {"n": 0}

    def sse(kind: str, **body) -> str:
        seq["n"] += 1
        return (f"event: {kind}\ndata: "
                f"{json.dumps({'type': kind, 'sequence_number': seq['n'] - 1, **body})}\n\n")

    split = OutputSplit(run.plan.info)
    reasoning: list[str] = []
    text: list[str] = []
    msg = _message_item("", status="in_progress")
    msg["content"] = []
    opened = False

    def open_message() -> list[str]:
        return [sse("response.output_item.added", output_index=0, item=msg),
                sse("response.content_part.added", item_id=msg["id"], output_index=0,
                    content_index=0, part={"type": "output_text", "text": "",
                                           "annotations": [], "logprobs": []})]
    try:
        yield sse("response.created", response=resp)
        yield sse("response.in_progress", response=resp)
        async for ev in run.events_until_end():
            if ev[0] == "delta":
                r, c = split.feed(ev[2])
                reasoning.append(r)
                if c:
                    if not opened:
                        opened = True
                        for line in open_message():
                            yield line
                    text.append(c)
                    yield sse("response.output_text.delta", item_id=msg["id"], output_index=0,
                              content_index=0, delta=c, logprobs=[])
                continue
            result = ev[1][0]
            r, c, calls = split.finish()
            reasoning.append(r)
            if c or not (opened or calls):
                if not opened:
                    opened = True
                    for line in open_message():
                        yield line
                text.append(c)
                if c:
                    yield sse("response.output_text.delta", item_id=msg["id"], output_index=0,
                              content_index=0, delta=c, logprobs=[])
            output: list[dict] = []
            if opened:
                whole = "".join(text)
                done = _message_item(whole, msg["id"])
                yield sse("response.output_text.done", item_id=msg["id"], output_index=0,
                          content_index=0, text=whole, logprobs=[])
                yield sse("response.content_part.done", item_id=msg["id"], output_index=0,
                          content_index=0, part=done["content"][0])
                yield sse("response.output_item.done", output_index=0, item=done)
                output.append(done)
            extra = ([_reasoning_item("".join(reasoning))] if "".join(reasoning) else []) + \
                [_call_item(c) for c in calls]
            for item in extra:
                i = len(output)
                yield sse("response.output_item.added", output_index=i,
                          item={**item, "status": "in_progress"})
                if item["type"] == "function_call":
                    yield sse("response.function_call_arguments.delta", item_id=item["id"],
                              output_index=i, delta=item["arguments"])
                    yield sse("response.function_call_arguments.done", item_id=item["id"],
                              output_index=i, arguments=item["arguments"], name=item["name"])
                yield sse("response.output_item.done", output_index=i, item=item)
                output.append(item)
            final = _final(resp, result, prompt_tokens, output)
            yield sse("response.completed" if final["status"] == "completed"
                      else "response.incomplete", response=final)
    except APIError as err:
        yield sse("error", code=err.code, message=err.message, param=err.param)
    finally:
        run.close("client")
