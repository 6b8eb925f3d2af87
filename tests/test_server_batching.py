"""Server chats through continuous batching (server/batching.py): concurrent clients of one
resident decoder decode in one batched step per token, and each gets exactly the answer it gets
alone (the single-sequence path, --max-batch 1), over OpenAI and Ollama routes, streamed or not;
requests the batch cannot serve run alone; a client that leaves frees its slot; one failing
sequence does not end the others; slots are sized from the memory budget."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.registry import ModelRegistry

MODEL = "tiny-qwen3"
PROMPTS = ["hello", "the quick brown fox", "What time is it in Oslo?", "a b c d e f"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp("llm") / MODEL
    build_model("qwen3", path, seed=5)
    reg = ModelRegistry(max_models=2)
    reg.add_dir(path)
    app = create_app(ServerConfig(default_model=False, max_batch=4), registry=reg)
    with BackgroundServer(app) as srv:
        srv.srv, srv.path = app.state.server, path
        yield srv


def _runner(live):
    srv = live.srv
    return srv.batcher.runner(MODEL, srv.registry.loaded[MODEL])


def ask(url: str, route: str, prompt: str, stream: bool, max_tokens: int = 20,
        **extra) -> tuple[str, str, int]:
    """(text, finish_reason, completion tokens) of one request."""
    if route == "ollama":
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                "stream": stream, "options": {"temperature": 0, "num_predict": max_tokens}}
        r = httpx.post(url + "/api/chat", json=body, timeout=120)
        assert r.status_code == 200, r.text
        lines = [json.loads(x) for x in r.text.splitlines() if x.strip()]
        last = lines[-1]
        return ("".join(x["message"]["content"] for x in lines), last["done_reason"],
                last["eval_count"])
    chat = route == "chat"
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "stream": stream, **extra}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = httpx.post(url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body,
                   timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        d = r.json()
        c = d["choices"][0]
        return (c["message"]["content"] if chat else c["text"], c["finish_reason"],
                d["usage"]["completion_tokens"])
    events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    assert "error" not in events[-1], events[-1]
    text = "".join((e["choices"][0]["delta"].get("content") or "") if chat
                   else e["choices"][0]["text"] for e in events if e["choices"])
    finish = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
    return text, finish, events[-1]["usage"]["completion_tokens"]


CASES = [("chat", PROMPTS[0], False, {}), ("chat", PROMPTS[1], True, {}),
         ("text", PROMPTS[2], False, {}), ("ollama", PROMPTS[3], True, {}),
         ("chat", PROMPTS[2], True, {"stop": ["e"]}), ("ollama", PROMPTS[1], False, {})]


def _concurrently(fn, items):
    gate = threading.Barrier(len(items))

    def one(item):
        gate.wait()
        return fn(item)
    with ThreadPoolExecutor(len(items)) as pool:
        return list(pool.map(one, items))


def test_concurrent_chats_batch_and_equal_their_answers_alone(live):
    srv = live.srv
    srv.batcher.max_batch = 1                          # the single-sequence path, one by one
    try:
        alone = [ask(live.url, r, p, s, **x) for r, p, s, x in CASES]
    finally:
        srv.batcher.max_batch = 4
    assert srv.batcher.routed["off"] == len(CASES)
    runner = _runner(live)
    for _ in range(2):                                 # a second round joins warm programs
        got = _concurrently(lambda c: ask(live.url, c[0], c[1], c[2], **c[3]), CASES)
        assert got == alone
    assert srv.batcher.routed["batch"] == 2 * len(CASES)
    assert runner.max_batch >= 2 and runner.sessions >= 1    # they really decoded together
    assert runner.queued == 0 and runner.active == 0
    assert any(t for t, _, _ in alone) and {f for _, f, _ in alone} <= {"stop", "length"}


def test_requests_the_batch_cannot_serve_run_alone_meanwhile(live):
    srv = live.srv
    before = dict(srv.batcher.routed)

    def go(i):
        if i == 0:                                     # logprobs: the single-sequence path
            r = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2})
            assert r.status_code == 200, r.text
            return len(r.json()["choices"][0]["logprobs"]["content"])
        if i == 1:                                     # Ollama's repeat_penalty: alone too
            r = httpx.post(live.url + "/api/generate", timeout=120, json={
                "model": MODEL, "prompt": "the quick", "stream": False,
                "options": {"temperature": 0, "num_predict": 6, "repeat_penalty": 1.3}})
            assert r.status_code == 200, r.text
            return r.json()["eval_count"]
        return ask(live.url, "chat", PROMPTS[i], False, max_tokens=12)[2]
    counts = _concurrently(go, range(4))
    assert all(n > 0 for n in counts)
    after = srv.batcher.routed
    assert after["logprobs"] - before.get("logprobs", 0) == 1
    assert after["repetition_penalty"] - before.get("repetition_penalty", 0) == 1
    assert after["batch"] - before.get("batch", 0) == 2


def test_client_disconnect_frees_its_slot(live):
    runner = _runner(live)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": 400, "temperature": 0.9, "seed": 1, "stream": True}
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", live.url + "/v1/chat/completions", json=body) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: {")
                if seen >= 4:
                    break                               # leave mid-stream
            assert runner.active >= 1
    deadline = time.monotonic() + 30
    while (runner.active or runner._driving) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runner.active == 0 and not runner._driving          # slot freed, drive ended
    assert ask(live.url, "chat", PROMPTS[0], False, max_tokens=4)[1] in ("stop", "length")


def test_a_failing_sequence_does_not_end_the_others(live, monkeypatch):
    import torch_xdna.engine.llm.batching as batching
    base = batching.Sampler

    class Flaky(base):                                  # seed 666's sampler fails at token 3
        calls = 0

        def __call__(self, logits, context=None):
            if self.p.seed == 666:
                self.calls += 1
                if self.calls == 3:
                    raise ValueError("the model produced non-finite logits (injected)")
            return super().__call__(logits, context)
    srv = live.srv
    srv.batcher.max_batch = 1
    try:
        alone = [ask(live.url, "chat", p, False, max_tokens=10) for p in PROMPTS[:3]]
    finally:
        srv.batcher.max_batch = 4
    monkeypatch.setattr(batching, "Sampler", Flaky)

    def go(i):
        if i == 3:
            r = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
                "model": MODEL, "messages": [{"role": "user", "content": PROMPTS[3]}],
                "max_tokens": 10, "temperature": 0, "seed": 666})
            return r.status_code, r.json()["error"]["message"]
        return ask(live.url, "chat", PROMPTS[i], False, max_tokens=10)
    got = _concurrently(go, range(4))
    assert got[:3] == alone
    assert got[3][0] == 400 and "non-finite" in got[3][1]


def test_slots_follow_the_memory_budget_and_none_fitting_serves_alone(live):
    from torch_xdna.engine.llm.batching import BATCH_MEMORY_SHARE, slot_bytes, slots_for_budget
    srv = live.srv
    engine = srv.registry.loaded[MODEL].engine
    dev, per = engine.decoder.dev, slot_bytes(engine)
    budget = dev.memory_budget
    used = dev.counters.allocated_bytes
    runner = _runner(live)
    try:
        dev.memory_budget = used + int(2.5 * per / BATCH_MEMORY_SHARE)
        assert slots_for_budget(engine, 8) == 2 and slots_for_budget(engine, 1) == 1
        srv.batcher.max_batch = 1
        try:
            alone = [ask(live.url, "chat", p, False, max_tokens=8) for p in PROMPTS]
        finally:
            srv.batcher.max_batch = 4
        # not one slot fits (allocated bytes read again: the process-wide device may have freed
        # earlier tests' buffers meanwhile, e.g. by garbage collection)
        dev.memory_budget = dev.counters.allocated_bytes + per // 2
        assert slots_for_budget(engine, 4) == 0
        n0 = runner.alone
        got = _concurrently(lambda p: ask(live.url, "chat", p, False, max_tokens=8), PROMPTS)
        assert got == alone and runner.alone - n0 == len(PROMPTS)
    finally:
        dev.memory_budget = budget


def test_serve_max_batch_option():
    from torch_xdna.cli.main import build_parser
    args = build_parser().parse_args(["serve", "--max-batch", "2"])
    assert args.max_batch == 2
    assert build_parser().parse_args(["serve"]).max_batch == 4


def test_a_finished_sequence_leaves_prompt_and_answer_in_the_prefix_cache(live):
    from torch_xdna.engine.llm.batching import BatchSession
    from torch_xdna.engine.llm.generate import GenerationConfig
    from torch_xdna.engine.llm.prefix_cache import BLOCK
    engine = live.srv.registry.loaded[MODEL].engine
    pc = engine.prefix_cache
    prompt = list(range(100, 100 + BLOCK - 10))       # less than one block: nothing kept yet
    with BatchSession(engine, slots=2) as session:
        seq = session.add(prompt, GenerationConfig(max_tokens=30, stop_token_ids=()))
        session.run()
    assert seq.fed == 29                               # the 30th token was never fed
    follow_up = prompt + seq.token_ids + [7, 8, 9]
    assert pc.restore(engine.decoder.dev, engine.decoder.cache, follow_up) == BLOCK
    cfg = GenerationConfig(max_tokens=6, stop_token_ids=())
    reused = engine.complete(follow_up, cfg)           # from the slot's KV entries
    assert reused.stats.cached_tokens == BLOCK
    pc.clear()
    assert engine.complete(follow_up, cfg).token_ids == reused.token_ids


def test_full_batch_queue_answers_429(live):
    import threading as th

    from torch_xdna.engine.llm.generate import GenerationConfig
    from torch_xdna.server.schemas import APIError
    srv = live.srv
    model = srv.registry.loaded[MODEL]
    release = th.Event()
    blocker = srv.worker.call(lambda: release.wait(30))      # the device is busy meanwhile
    limit, srv.config.max_queue = srv.config.max_queue, 2
    try:
        cfg = GenerationConfig(max_tokens=2)
        handles = [srv.batcher.submit(MODEL, model, [5, 6, 7], cfg) for _ in range(2)]
        with pytest.raises(APIError) as e:
            srv.batcher.submit(MODEL, model, [5, 6, 7], cfg)
        assert e.value.status == 429 and e.value.code == "queue_full"
    finally:
        srv.config.max_queue = limit
        release.set()
    blocker.result(30)
    assert all(len(h.result()) <= 2 and h.finished for h in handles)


def test_shutdown_ends_batched_requests_with_json_and_sse_errors(live):
    """Two chats decoding in one batch when the server is told to stop: after the grace
    period both end in OpenAI's error shape (the stream with an error event and [DONE])."""
    from torch_xdna.server.http import HttpLimits
    reg = ModelRegistry(max_models=1)
    reg.add_dir(live.path)
    app = create_app(ServerConfig(default_model=False, limits=HttpLimits(graceful_timeout_s=0.1)),
                     registry=reg)
    bg = BackgroundServer(app)
    bg.__enter__()
    srv = app.state.server
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 480, "temperature": 0}           # greedy: no EOS within 480 tokens
    out: dict = {}

    def plain():
        r = httpx.post(bg.url + "/v1/chat/completions", json=body, timeout=60)
        out["plain"] = (r.status_code, r.text)

    def stream():
        with httpx.stream("POST", bg.url + "/v1/chat/completions", timeout=60,
                          json={**body, "stream": True}) as r:
            out["stream"] = [ln for ln in r.iter_lines() if ln]
    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    for t in threads:
        t.start()
    runner = srv.batcher.runner(MODEL, srv.registry.loaded[MODEL])
    deadline = time.monotonic() + 30
    while runner.active < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runner.active == 2                              # both decoding together
    t0 = time.monotonic()
    bg.__exit__(None, None, None)
    for t in threads:
        t.join(30)
    assert time.monotonic() - t0 < 10
    code, text = out["plain"]
    assert code == 503 and json.loads(text)["error"]["code"] == "shutting_down", text
    lines = out["stream"]
    assert lines[-1] == "data: [DONE]" and "shutting_down" in lines[-2], lines[-3:]
    assert runner.active == 0
