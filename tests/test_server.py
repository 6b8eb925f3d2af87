"""The OpenAI-compatible server through fastapi's TestClient: routes, encodings, every kind of bad
input, auth, limits, stop sequences and streaming with a fake chat model."""
from __future__ import annotations

import base64
import json
import struct
import time

import pytest
import torch
from fastapi.testclient import TestClient

from torch_xdna.engine.embed.embedder import Embedder
from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.chat import GenerationParams, StopMatcher, run_generation
from torch_xdna.server.registry import ModelRegistry

WORDS = ["hello", " world", " foo", " bar", " baz"]


class FakeChat:
    """A deterministic ChatModel: cycles through WORDS, one word per token."""

    context_length = 64

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.calls = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def chat_prompt(self, messages):
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages))

    def stream(self, prompt_ids, params, cancelled):
        self.calls += 1
        for i in range(params.max_tokens):
            if self.delay:
                time.sleep(self.delay)
            yield WORDS[i % len(WORDS)]


@pytest.fixture(scope="module")
def embedder():
    emb = Embedder.load()
    yield emb
    emb.close()


def make_client(embedder, **config) -> TestClient:
    reg = ModelRegistry(max_models=config.pop("max_models", 2))
    reg.add_object(embedder, "embedding", "all-MiniLM-L6-v2")
    reg.add_object(FakeChat(), "chat", "fake-chat")
    return TestClient(create_app(ServerConfig(**config), registry=reg))


@pytest.fixture(scope="module")
def client(embedder):
    with make_client(embedder) as c:
        yield c


def test_health_models_metrics(client):
    h = client.get("/health").json()
    assert h["status"] == "ok" and h["backend"] == "sim"
    assert "simulated NPU" in h["backend_description"]
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    cards = {m["id"]: m for m in models["data"]}
    assert cards["all-MiniLM-L6-v2"]["kind"] == "embedding" and cards["fake-chat"]["kind"] == "chat"
    assert cards["all-MiniLM-L6-v2"]["dimensions"] == 384
    assert client.get("/v1/models/fake-chat").json()["id"] == "fake-chat"
    assert client.get("/v1/models/nope").status_code == 404
    client.post("/v1/embeddings", json={"input": "metrics please"})
    text = client.get("/metrics").text
    assert 'xdna_requests_total{method="POST",route="/v1/embeddings",status="200"}' in text
    assert "xdna_request_duration_seconds_bucket" in text
    assert 'xdna_tokens_total{kind="prompt",model="all-MiniLM-L6-v2"}' in text
    assert "process_resident_memory_bytes" in text and "xdna_device_live_buffers" in text
    assert "xdna_npu_modeled_seconds_total" in text and "xdna_npu_dispatches_total" in text


def test_embeddings_float_base64_dimensions(client, embedder):
    texts = ["hello world", "Ünïcödé café 🚀"]
    expected = embedder.embed(texts)
    r = client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "all-MiniLM-L6-v2"
    assert [d["index"] for d in body["data"]] == [0, 1]
    got = torch.tensor([d["embedding"] for d in body["data"]])
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)
    n_tokens = sum(len(x) for x in embedder.tokenize(texts))
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert r.headers["x-xdna-backend"] == "sim"

    r = client.post("/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"})
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    vec = torch.tensor(struct.unpack("<384f", raw))
    torch.testing.assert_close(vec, expected[0], atol=2e-5, rtol=0)

    r = client.post("/v1/embeddings", json={"input": texts, "dimensions": 64})
    got = torch.tensor([d["embedding"] for d in r.json()["data"]])
    assert got.shape == (2, 64)
    torch.testing.assert_close(got, torch.nn.functional.normalize(expected[:, :64], dim=-1),
                               atol=5e-5, rtol=0)


def test_token_array_inputs_match_text(client, embedder):
    text = "hello world"
    ids = embedder.tokenize([text])[0][1:-1]          # without [CLS]/[SEP]
    a = client.post("/v1/embeddings", json={"input": ids}).json()
    b = client.post("/v1/embeddings", json={"input": [ids, ids]}).json()
    assert len(b["data"]) == 2
    ref = embedder.embed([text])[0]
    for d in a["data"] + b["data"]:
        torch.testing.assert_close(torch.tensor(d["embedding"]), ref, atol=2e-5, rtol=0)


BAD = [
    # (raw body, status, code, param)
    ("{not json", 400, None, None),
    ("[1, 2]", 400, None, None),
    ('{"input": 5}', 400, "invalid_value", "input"),
    ('{"input": ["a", 3]}', 400, "invalid_value", "input"),
    ('{"input": []}', 400, "invalid_value", "input"),
    ('{"input": ""}', 400, "invalid_value", "input"),
    ('{"input": ["ok", ""]}', 400, "invalid_value", "input"),
    ('{"input": [[]]}', 400, "invalid_value", "input"),
    ('{"input": [[1, 99999999]]}', 400, "invalid_value", "input"),
    ('{"model": "all-MiniLM-L6-v2"}', 400, "missing_required_parameter", "input"),
    ('{"input": "x", "model": "no-such-model"}', 404, "model_not_found", "model"),
    ('{"input": "x", "model": "fake-chat"}', 400, "model_not_supported", "model"),
    ('{"input": "x", "encoding_format": "int8"}', 400, "invalid_value", "encoding_format"),
    ('{"input": "x", "dimensions": 0}', 400, "invalid_value", "dimensions"),
    ('{"input": "x", "dimensions": 385}', 400, "invalid_value", "dimensions"),
    ('{"input": "x", "dimensions": "many"}', 400, "invalid_value", "dimensions"),
    ('{"input": "' + "word " * 400 + '"}', 400, "context_length_exceeded", "input"),
]


@pytest.mark.parametrize("body,status,code,param", BAD)
def test_bad_embedding_requests(client, body, status, code, param):
    r = client.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"] == "invalid_request_error"
    assert (err["code"], err["param"]) == (code, param)


BAD_CHAT = [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, "top_p"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 99}, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": {}}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x" * 80}]}, "messages"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT)
def test_bad_chat_requests(client, body, param):
    r = client.post("/v1/chat/completions", json={"model": "fake-chat", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]


def test_unknown_route_and_method(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.get("/v1/embeddings")
    assert r.status_code == 405 and "error" in r.json()


def test_chat_and_completions_with_stop(client):
    r = client.post("/v1/chat/completions", json={
        "model": "fake-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hello world foo bar"}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len("<user>hi"), "completion_tokens": 4,
                             "total_tokens": len("<user>hi") + 4}
    r = client.post("/v1/completions", json={"model": "fake-chat", "prompt": "go",
                                             "max_tokens": 10, "stop": "o b"})
    choice = r.json()["choices"][0]
    assert choice["text"] == "hello world fo" and choice["finish_reason"] == "stop"


def test_chat_streaming_sse(client):
    with client.stream("POST", "/v1/chat/completions", json={
            "model": "fake-chat", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "hello world foo"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1


def test_stop_matcher_across_pieces():
    m = StopMatcher(["END", "xy"])
    out = []
    for piece in ["ab", "cE", "N", "D tail"]:
        text, stopped = m.feed(piece)
        out.append(text)
        if stopped:
            break
    assert "".join(out) == "abc" and stopped
    m = StopMatcher(["END"])
    assert m.feed("aE") == ("a", False) and m.feed("x") == ("Ex", False)

    class Model(FakeChat):
        pass
    got = []
    res = run_generation(Model(), [1, 2], GenerationParams(max_tokens=5, stop=[" bar"]),
                         lambda i, text, lp: got.append(text), lambda: False)
    assert "".join(got) == "hello world foo" and res[0].finish_reason == "stop"


def test_api_key_body_limit_and_input_limits(embedder):
    with make_client(embedder, api_key="sekrit", max_body_bytes=2000, max_inputs=3) as c:
        assert c.get("/health").status_code == 200                # open for probes
        r = c.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.get("/v1/models", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "Incorrect API key" in r.json()["error"]["message"]
        auth = {"Authorization": "Bearer sekrit"}
        assert c.get("/v1/models", headers=auth).status_code == 200
        assert c.get("/metrics").status_code == 401
        r = c.post("/v1/embeddings", json={"input": ["a", "b", "c", "d"]}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_inputs"
        r = c.post("/v1/embeddings", json={"input": "x" * 3000}, headers=auth)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert c.post("/v1/embeddings", json={"input": ["a", "b", "c"]}, headers=auth).status_code == 200


def test_truncate_option(embedder):
    long = "word " * 400
    with make_client(embedder, truncate=True) as c:
        r = c.post("/v1/embeddings", json={"input": long})
        assert r.status_code == 200
        assert r.json()["usage"]["prompt_tokens"] == 256
        torch.testing.assert_close(torch.tensor(r.json()["data"][0]["embedding"]),
                                   embedder.embed([long])[0], atol=2e-5, rtol=0)


def test_registry_lru_eviction(tmp_path):
    class Closable:
        def __init__(self):
            self.closed = False

        def close(self):
            self.closed = True

    reg = ModelRegistry(max_models=2)
    made = {}
    for name in ("a", "b", "c"):
        from torch_xdna.server.registry import ModelEntry

        def factory(name=name):
            made[name] = Closable()
            return made[name]
        reg.entries[name] = ModelEntry(name, "chat", factory)
    reg.get(reg.entries["a"])
    reg.get(reg.entries["b"])
    reg.get(reg.entries["a"])                 # a is now most recent
    reg.get(reg.entries["c"])                 # evicts b
    assert reg.loaded_ids() == ["a", "c"] and made["b"].closed and not made["a"].closed
    assert reg.evictions == 1 and reg.loads == 3


def test_worker_merges_waiting_batch_jobs_and_isolates_failures():
    import threading
    from torch_xdna.server.worker import DeviceWorker, Job, QueueFull
    w = DeviceWorker(max_queue=4)
    w.start()
    gate = threading.Event()
    blocker = w.call(gate.wait)                 # hold the device while jobs queue up
    deadline = time.monotonic() + 10
    while not (w.busy and w.depth == 0) and time.monotonic() < deadline:
        time.sleep(0.005)                       # until the worker runs it (not a fixed sleep)
    assert w.busy and w.depth == 0
    calls = []

    def double(payloads):
        calls.append(list(payloads))
        if any(p < 0 for p in payloads):
            raise ValueError("negative")
        return [p * 2 for p in payloads]
    jobs = [Job(batch_key=("k",), batch_fn=double, payload=p) for p in (1, -5, 3)]
    futures = [w.submit(j) for j in jobs]
    w.submit(Job(fn=lambda: "other"))
    with pytest.raises(QueueFull):
        w.submit(Job(fn=lambda: None))
    gate.set()
    assert blocker.result(5) is True
    assert futures[0].result(5) == 2 and futures[2].result(5) == 6
    with pytest.raises(ValueError):
        futures[1].result(5)
    assert calls[0] == [1, -5, 3]               # merged into one engine call, then retried alone
    assert w.merged_jobs == 0 and w.depth == 0
    w.stop()


def test_lru_models_unload_and_reload_with_same_answers(tmp_path):
    from test_embed import _tiny_bert_dir
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    dir_a, _ = _tiny_bert_dir(tmp_path / "a", pooling_cls=False)
    dir_b, _ = _tiny_bert_dir(tmp_path / "b", pooling_cls=True)
    reg = ModelRegistry(max_models=1)
    reg.add_dir(dir_a, "bert-a")
    reg.add_dir(dir_b, "bert-b")
    app = create_app(ServerConfig(default_model=False), registry=reg)
    dev = app.state.server.dev
    with TestClient(app) as c:
        first = {}
        for round_ in range(2):
            for name in ("bert-a", "bert-b"):
                r = c.post("/v1/embeddings", json={"model": name, "input": ["hello there"]})
                assert r.status_code == 200, r.text
                vec = r.json()["data"][0]["embedding"]
                assert len(vec) == 64
                if round_ == 0:
                    first[name] = vec
                else:
                    assert vec == first[name]              # reloaded model, identical answer
                assert reg.loaded_ids() == [name]
                if round_ == 0 and name == "bert-b":
                    allocated = dev.counters.allocated_bytes
        assert reg.evictions >= 3
        assert dev.counters.allocated_bytes == allocated       # eviction frees device memory
    assert first["bert-a"] != first["bert-b"]


def test_cors_is_off_by_default_and_allows_only_configured_origins(embedder, client):
    pre = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"}
    r = client.options("/v1/embeddings", headers=pre)
    assert "access-control-allow-origin" not in r.headers
    with make_client(embedder, cors_origins=["http://localhost:3000"]) as c:
        r = c.options("/v1/embeddings", headers=pre)
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = c.options("/v1/embeddings", headers={**pre, "Origin": "http://evil.example"})
        assert r.headers.get("access-control-allow-origin") != "http://evil.example"
        r = c.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"},
                   headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
