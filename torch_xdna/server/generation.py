"""One generation request on the device worker, as a stream of events, for every API surface
(OpenAI chat/completions in routes/openai_chat.py, Ollama in routes/ollama.py).

GenerationRun submits the job, validates the prompt against the model's context and the server's
limits on the worker, and hands the route ("start", prompt_tokens), then ("delta", index, text,
logprobs) events and ("end", [GenerationResult per sample]). It stops at the next token when the
client disconnects or the shutdown grace period ends. A request for a resident decoder that the
batch can serve (server/batching.py's policy) joins that model's running batch instead of taking
a device job of its own; its events are the same.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import Request

from torch_xdna.server.batching import HandleSource
from torch_xdna.server.chat import GenerationParams, run_generation
from torch_xdna.server.errors import as_api_error, client_gone, shutting_down
from torch_xdna.server.registry import ModelEntry
from torch_xdna.server.schemas import APIError
from torch_xdna.server.state import Cancel, Server, until_disconnected
from torch_xdna.server.worker import Job


@dataclass
class GenerationPlan:
    """What to run. setup(model) -> prompt ids (worker thread; may refine `params`, e.g. set a
    grammar that depends on the model's chat template); `param`: the request field holding the
    prompt, named in errors; `info`: values setup wants the response side to see."""

    setup: Callable[[Any, GenerationParams], list[int]]
    params: GenerationParams
    max_tokens: int | None
    param: str = "messages"
    info: dict = field(default_factory=dict)


def logprob_items(model: Any, lps: list | None) -> list[dict] | None:
    """Engine TokenLogprobs -> [{"token", "logprob", "top": [(token, logprob)]}] (texts decoded)."""
    if not lps:
        return None
    text = getattr(model, "token_text", None) or (lambda t: str(t))
    return [{"token": text(x.token), "logprob": x.logprob,
             "top": [(text(t), lp) for t, lp in x.top]} for x in lps]


def _event_error(ev: tuple) -> BaseException:
    """The error an "error" or "done" event stands for ("done" before "end": the job never ran
    or died without a word)."""
    if ev[0] == "error":
        return ev[1]
    f: Future = ev[1]
    if f.cancelled():
        return client_gone()
    return f.exception() or RuntimeError("the generation job ended without a result")


async def _next_event(srv: Server, events: asyncio.Queue, fut) -> tuple:
    """The next event of a generation job; waits for the job to start within the timeout."""
    deadline = srv.config.request_timeout_s
    try:
        return await asyncio.wait_for(events.get(), deadline)
    except asyncio.TimeoutError:
        fut.cancel()
        srv.metrics.reject("timeout")
        return ("error", APIError(503, f"no progress within {deadline} s on the device; retry "
                                       f"later.", type="server_error", code="timeout"))



class GenerationRun:
    def __init__(self, srv: Server, request: Request, entry: ModelEntry, plan: GenerationPlan):
        self.srv, self.request, self.entry, self.plan = srv, request, entry, plan
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancel = Cancel()
        self.fut = None
        self.watch = None
        self.pre: list[int] | None = None     # prompt ids tokenized before the job was queued

    def _put(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:           # the loop has closed (server stopped): nobody is waiting
            pass

    def _work(self) -> None:
        """The single-sequence path: one device job loads the model and generates."""
        cancel, put = self.cancel, self._put
        try:
            if cancel():
                return                     # the client left while the job waited in the queue
            model = self.srv.load(self.entry)
            ids = self._validate(model)
            put("start", len(ids))
            self._generate(model, ids)
        except BaseException as e:        # noqa: BLE001 - handed to the request
            put("error", e)

    def _work_batched(self, model: Any) -> None:
        """The batched path (a request thread): validate, join the model's running batch
        (server/batching.py) and consume this generation's tokens as they come."""
        cancel, put = self.cancel, self._put
        try:
            if cancel():
                return
            ids = self._validate(model)
            handle = self.srv.batcher.submit(self.entry.id, model, ids,
                                             model.generation_config(self.plan.params))
            put("start", len(ids))
            self._generate(HandleSource(model, handle), ids)
        except BaseException as e:        # noqa: BLE001 - handed to the request
            put("error", e)

    def _validate(self, model: Any) -> list[int]:
        """The prompt ids, checked against the model's features and context and the server's
        limits (APIError otherwise); sets params.max_tokens."""
        config, entry, plan = self.srv.config, self.entry, self.plan
        params = plan.params
        ids = self.pre if self.pre is not None else as_ids(plan.setup(model, params))
        missing = params.needs() - set(getattr(model, "features", ()))
        if missing:
            raise APIError(400, f"the model '{entry.id}' does not support "
                                f"{', '.join(sorted(missing))}; drop those parameters or use "
                                f"a decoder model.", code="unsupported_parameter")
        if params.grammar is not None:
            self._check_grammar(model, params)
        if not ids:
            raise APIError(400, "the prompt encodes to zero tokens; send some text.",
                           param=plan.param, code="invalid_value")
        ctx = int(model.context_length)
        room = ctx - len(ids)
        if room <= 0:
            raise APIError(400, f"the prompt is {len(ids)} tokens; {entry.id}'s context is "
                                f"{ctx} tokens. Shorten the prompt.", param=plan.param,
                           code="context_length_exceeded")
        limit = plan.max_tokens if plan.max_tokens is not None \
            else min(room, config.max_new_tokens)
        if limit > config.max_new_tokens:
            raise APIError(400, f"max_tokens is {limit}; this server allows at most "
                                f"{config.max_new_tokens}.", param="max_tokens",
                           code="invalid_value")
        if limit > room:
            raise APIError(400, f"this model's maximum context length is {ctx} tokens; the "
                                f"prompt is {len(ids)} tokens and max_tokens is {limit}. Lower "
                                f"max_tokens or shorten the prompt.", param="max_tokens",
                           code="context_length_exceeded")
        params.max_tokens = limit
        return ids

    def _generate(self, source: Any, ids: list[int]) -> None:
        """run_generation over `source` (the model, or a batched generation's HandleSource)."""
        cancel, put = self.cancel, self._put
        text_of = source.model if isinstance(source, HandleSource) else source   # logprob texts
        results = run_generation(
            source, ids, self.plan.params,
            lambda i, text, lps: put("delta", i, text, logprob_items(text_of, lps)), cancel)
        if cancel.reason == "shutdown":
            put("error", shutting_down(sum(r.completion_tokens for r in results)))
        else:
            put("end", results)

    def _check_grammar(self, model: Any, params: GenerationParams) -> None:
        from torch_xdna.engine.llm.constrained import GrammarError
        try:
            model.check_grammar(params.grammar)
        except GrammarError as e:
            raise APIError(400, str(e), param=self.plan.info.get("grammar_param",
                                                                 "response_format"),
                           code="invalid_value") from None

    async def start(self) -> int:
        """Submit the job; the prompt's token count once it runs (APIError otherwise)."""
        srv, cancel = self.srv, self.cancel
        resident = srv.registry.loaded.get(self.entry.id)
        if resident is not None:
            # tokenize (a prompt may be huge) on the thread pool, not on the device worker; any
            # failure is left to the worker's path, which reports it as before
            from starlette.concurrency import run_in_threadpool
            try:
                self.pre = as_ids(await run_in_threadpool(self.plan.setup, resident, self.plan.params))
            except Exception:              # noqa: BLE001
                self.pre = None
        srv.track(cancel, lambda: self.events.put_nowait(("error", shutting_down())))
        try:
            if resident is not None and self.pre is not None \
                    and not getattr(self.pre, "images", None) \
                    and srv.batcher.accepts(resident, self.plan.params):
                self.fut = self._start_batched(resident)
            else:
                self.fut = srv.submit(Job(fn=srv.npu_job(self._work)))
        except BaseException:
            srv.untrack(cancel)
            raise
        # a job that never ran (dropped at shutdown, cancelled) still ends the request
        self.fut.add_done_callback(lambda f: (srv.untrack(cancel), self._put("done", f)))
        self.watch = asyncio.ensure_future(until_disconnected(self.request))
        self.watch.add_done_callback(self._gone)
        try:
            first = await _next_event(srv, self.events, self.fut)
            if first[0] != "start":
                raise as_api_error(_event_error(first))
            return first[1]
        except BaseException:
            self.cancel.set("done")
            self.stop_watching()
            raise

    def _start_batched(self, model: Any) -> Future:
        """Run _work_batched on a thread of its own (it waits on the batch, not the device)."""
        fut: Future = Future()
        fut.set_running_or_notify_cancel()

        def run() -> None:
            try:
                self._work_batched(model)
            finally:
                fut.set_result(None)
        threading.Thread(target=run, name="xdna-batched-request", daemon=True).start()
        return fut

    def _gone(self, task: asyncio.Task) -> None:
        if not task.cancelled():
            self.cancel.set("client")
            self.fut.cancel()
            self.srv.metrics.reject("client_gone")
            self.events.put_nowait(("error", client_gone()))

    def stop_watching(self) -> None:
        """Streaming responses: Starlette watches the client from here on."""
        if self.watch is not None:
            self.watch.remove_done_callback(self._gone)
            self.watch.cancel()
            self.watch = None

    async def events_until_end(self) -> AsyncIterator[tuple]:
        """("delta", index, text, logprobs)... then ("end", results); an error raises APIError."""
        while True:
            ev = await _next_event(self.srv, self.events, self.fut)
            if ev[0] in ("delta", "end"):
                yield ev
                if ev[0] == "end":
                    self._count(ev[1])
                    return
            else:
                raise as_api_error(_event_error(ev))

    async def text(self) -> tuple[str, Any]:
        """A one-sample run to its end: (the whole text, its GenerationResult)."""
        parts: list[str] = []
        try:
            async for ev in self.events_until_end():
                if ev[0] == "delta":
                    parts.append(ev[2])
                else:
                    result = ev[1][0]
        finally:
            self.close("done")
        return "".join(parts), result

    def _count(self, results: list) -> None:
        m, eid = self.srv.metrics, self.entry.id
        m.add_tokens(eid, "prompt", results[0].prompt_tokens if results else 0)
        m.add_tokens(eid, "completion", sum(r.completion_tokens for r in results))

    def close(self, reason: str = "client") -> None:
        self.cancel.set(reason)
        self.stop_watching()


# --- the chat path every API surface shares -------------------------------------------------------
def chat_plan(messages: list[dict], tools: list[dict], choice: Any, params: GenerationParams,
              max_tokens: int | None, parallel: bool = True, template_vars: dict | None = None,
              param: str = "messages") -> GenerationPlan:
    """OpenAI-shaped messages and tools -> the plan of one chat request, for every API (OpenAI
    chat, Responses, Anthropic Messages, Ollama). `choice`: "none" | "auto" | "required" | the
    name of the one function to call. The model's tool convention, the grammar of a forced call,
    the template variables (enable_thinking, ...) and whether the prompt opened a think block
    are settled on the worker, where the model is; `info` carries them to the response side."""
    tools = tools if choice != "none" else []
    if choice in ("none", "auto", "required"):
        forced = tools if choice == "required" else []
    else:
        forced = [t for t in tools if t["function"]["name"] == choice]
    info: dict = {"convention": None, "names": {t["function"]["name"] for t in tools},
                  "opened": False}
    extra_vars = dict(template_vars or {})

    def setup(model, params: GenerationParams) -> list[int]:
        from torch_xdna.server.tools import call_grammar, convention_of, render_messages
        if not getattr(model, "accepts_images", False):
            for i, m in enumerate(messages):
                if isinstance(m.get("content"), list):
                    raise APIError(400, f"{param}[{i}] has an image, and this model takes text "
                                        f"only; send it to a vision-language model (Gemma 3)",
                                   param=param, code="unsupported_content")
        template = getattr(model, "chat_template", None)
        conv = convention_of(template) if tools else None
        info["convention"] = conv
        msgs, extra = render_messages(messages, tools or None, conv or "prompt")
        if forced:
            from torch_xdna.engine.llm.constrained import Grammar
            from torch_xdna.server.tools import MAX_PARALLEL_CALLS
            params.grammar = Grammar("lark", call_grammar(
                forced, conv, MAX_PARALLEL_CALLS if choice == "required" and parallel else 1))
            info["grammar_param"] = "tool_choice"
        extra.update(extra_vars)
        ids = model.chat_prompt(msgs, **extra) if extra else model.chat_prompt(msgs)
        text_of = getattr(model, "token_text", None)
        if template and "<think>" in template and text_of and ids:
            tail = "".join(text_of(t) for t in ids[-4:])
            info["opened"] = tail.rstrip().endswith("<think>")
        return ids

    return GenerationPlan(setup, params, max_tokens, param, info)


class OutputSplit:
    """One sample's text -> reasoning, content and tool calls, as it streams: the think block
    first (engine/llm/text_stream.py's ThinkSplit), then the model's tool-call convention over
    the content (server/tools.py's ToolStream)."""

    def __init__(self, info: dict):
        from torch_xdna.engine.llm.text_stream import ThinkSplit
        from torch_xdna.server.tools import ToolStream
        self.think = ThinkSplit(info.get("opened", False))
        conv = info.get("convention")
        self.tools = ToolStream(conv, info["names"]) if conv else None

    def feed(self, text: str) -> tuple[str, str]:
        """New text -> (reasoning, content) to emit now."""
        reasoning, content = self.think.feed(text)
        return reasoning, (self.tools.feed(content) if self.tools else content)

    def finish(self) -> tuple[str, str, list]:
        """(reasoning, content still to emit, tool calls)."""
        reasoning, content = self.think.flush()
        if self.tools is None:
            return reasoning, content, []
        content = self.tools.feed(content)
        rest, calls = self.tools.finish()
        return reasoning, content + rest, calls

    @classmethod
    def whole(cls, info: dict, text: str) -> tuple[str, str, list]:
        """A complete output -> (reasoning, content, tool calls)."""
        split = cls(info)
        r1, c1 = split.feed(text)
        r2, c2, calls = split.finish()
        return r1 + r2, c1 + c2, calls


def as_ids(ids) -> list[int]:
    """A setup's prompt ids as a list; a list (subclass) as it is, so an image prompt keeps its
    images (engine/llm/vlm.py's ImagePrompt)."""
    return ids if isinstance(ids, list) else list(ids)


def fim_setup(prefix: str, suffix: str):
    """A plan's setup for fill-in-the-middle (`suffix` on /v1/completions and /api/generate):
    the model's FIM prompt, or a 400 when its tokenizer has no FIM tokens."""
    def setup(model, params: GenerationParams) -> list[int]:
        fim = getattr(model, "fim_prompt", None)
        ids = fim(prefix, suffix) if fim else None
        if ids is None:
            raise APIError(400, "this model has no fill-in-the-middle tokens, so 'suffix' cannot "
                                "be used (coder models such as Qwen2.5-Coder, StarCoder and "
                                "DeepSeek-Coder have them); drop 'suffix'", param="suffix",
                           code="unsupported_parameter")
        return ids
    return setup
