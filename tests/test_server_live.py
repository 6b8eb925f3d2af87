"""A real uvicorn server on 127.0.0.1 (random free port): the official openai client, a bounded
concurrent load test, queue-full answers, client disconnects mid-stream."""
from __future__ import annotations

import base64
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.registry import ModelRegistry

sys.path.insert(0, str(Path(__file__).parent))
from test_server import FakeChat  # noqa: E402

KEY = "test-key"
SENTENCES = ["hello world", "the cat sat on the mat", "Grüße aus Köln!", "东京", "a",
             "Embeddings map text to vectors.", "What time is it?", "🚀 launch", "x y z",
             "The NPU runs the encoder in one chained program per batch."]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from llm_fixtures import build_model
    qwen = tmp_path_factory.mktemp("llm") / "tiny-qwen3"
    build_model("qwen3", qwen)
    reg = ModelRegistry(max_models=3)
    reg.add_default_embedding()
    reg.add_dir(qwen)
    reg.add_object(FakeChat(), "chat", "fake-chat")
    app = create_app(ServerConfig(api_key=KEY), registry=reg)
    with BackgroundServer(app) as srv:
        yield srv


@pytest.fixture(scope="module")
def expected(live):
    """Each sentence's vector from the engine directly (the server's resident model)."""
    emb = live.app.state.server.registry.loaded["all-MiniLM-L6-v2"]
    return {s: emb.embed([s])[0] for s in SENTENCES}


def test_openai_client_embeddings_and_models(live, expected):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    ids = {m.id for m in client.models.list().data}
    assert {"all-MiniLM-L6-v2", "tiny-qwen3", "fake-chat"} <= ids
    want = torch.stack([expected[s] for s in SENTENCES[:3]])
    # no encoding_format: the SDK asks for base64 and decodes it to floats itself
    for kw in ({}, {"encoding_format": "float"}):
        r = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES[:3], **kw)
        got = torch.tensor([d.embedding for d in r.data])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
        assert r.usage.prompt_tokens > 0
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES[:3],
                                 encoding_format="base64")      # explicit: raw base64 strings
    raw = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in r.data]
    torch.testing.assert_close(torch.tensor(np.stack(raw)), want, atol=2e-5, rtol=0)
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input="hello world", dimensions=32)
    assert len(r.data[0].embedding) == 32
    assert abs(sum(x * x for x in r.data[0].embedding) - 1.0) < 1e-4


def test_openai_client_chat_tiny_llm(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    msgs = [{"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="tiny-qwen3", messages=msgs, max_tokens=6,
                                       temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 0
    stream = client.chat.completions.create(model="tiny-qwen3", messages=msgs, max_tokens=6,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content          # greedy: same text streamed or not
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    c = client.completions.create(model="tiny-qwen3", prompt="the quick", max_tokens=4,
                                  temperature=0.8, top_p=0.9, seed=7)
    c2 = client.completions.create(model="tiny-qwen3", prompt="the quick", max_tokens=4,
                                   temperature=0.8, top_p=0.9, seed=7)
    assert c.choices[0].text == c2.choices[0].text       # seeded sampling is reproducible
    r = client.chat.completions.create(model="fake-chat", messages=msgs, max_tokens=8,
                                       stop=[" bar"])
    assert r.choices[0].message.content == "hello world foo"
    assert r.choices[0].finish_reason == "stop"


def test_openai_client_error_objects(live):
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="nope", input="x")
    assert e.value.code == "model_not_found"
    # unknown fields are ignored (with a warning), as llama.cpp's server does
    assert client.embeddings.create(model="all-MiniLM-L6-v2", input="x", extra_body={"bogus": 1})
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input="word " * 300)
    assert e.value.code == "context_length_exceeded"
    bad = openai.OpenAI(base_url=live.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_concurrent_clients_get_their_own_answers(live, expected):
    """8 threads x 10 requests, each a random subset; every answer checked against its input."""
    deadline = time.monotonic() + 180
    errors: list[str] = []
    statuses: list[int] = []
    lock = threading.Lock()

    def client_thread(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=120) as http:
            for _ in range(10):
                if time.monotonic() > deadline:
                    with lock:
                        errors.append("deadline passed")
                    return
                texts = rng.sample(SENTENCES, rng.randint(1, 4))
                r = http.post("/v1/embeddings", json={"input": texts})
                with lock:
                    statuses.append(r.status_code)
                if r.status_code != 200:
                    body = r.json()
                    if r.status_code not in (429, 503) or "error" not in body:
                        with lock:
                            errors.append(f"{r.status_code}: {r.text[:200]}")
                    continue
                data = r.json()["data"]
                if [d["index"] for d in data] != list(range(len(texts))):
                    with lock:
                        errors.append("bad indices")
                for t, d in zip(texts, data):
                    # batch-invariant numerics: identical vectors whoever shares the batch
                    if not torch.equal(torch.tensor(d["embedding"]), expected[t]):
                        with lock:
                            errors.append(f"wrong vector for {t!r}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client_thread, range(8)))
    assert not errors, errors[:5]
    assert len(statuses) == 80 and statuses.count(200) >= 70, statuses
    worker = live.app.state.server.worker
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    assert worker.depth == 0
    metrics = httpx.get(live.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    assert "xdna_embeddings_total" in metrics


def test_queue_full_answers_429_and_server_survives():
    slow = FakeChat(delay=0.05)
    reg = ModelRegistry()
    reg.add_object(slow, "chat", "slow")
    app = create_app(ServerConfig(max_queue=1, preload=False), registry=reg)
    with BackgroundServer(app) as srv:
        def ask(_):
            r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
                "model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6})
            return r.status_code, r.json()
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(ask, range(6)))
        codes = [c for c, _ in results]
        assert set(codes) <= {200, 429} and 200 in codes and 429 in codes, codes
        for code, body in results:
            if code == 429:
                assert body["error"]["code"] == "queue_full" and body["error"]["type"] == "rate_limit_error"
            else:
                assert body["choices"][0]["message"]["content"] == "hello world foo bar bazhello"

        # a client that walks away mid-stream must not wedge the device worker
        with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=60, json={
                "model": "slow", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 40, "stream": True}) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i >= 2:
                    break
        t0 = time.monotonic()
        code, body = ask(0)
        assert code == 200 and time.monotonic() - t0 < 5.0
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"


def test_xdna_serve_command_starts_ready_for_curl(tmp_path):
    """`xdna serve` (only --port changed, to a free one) in a subprocess: logs the URL and the
    simulated backend, answers /v1/embeddings, stops on SIGINT."""
    from serve_process import free_port, xdna_serve
    port = free_port()
    log = tmp_path / "serve.log"
    with xdna_serve(["--port", str(port)], port, log) as url:
        r = httpx.post(url + "/v1/embeddings", json={"model": "all-MiniLM-L6-v2",
                                                     "input": "hello world"}, timeout=30)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
    text = log.read_text()
    assert url in text and "simulated NPU" in text, text
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")
    assert all(stamp.match(line) for line in text.splitlines()), text   # uvicorn's lines too
    assert '"POST /v1/embeddings HTTP/1.1" 200' in text


def test_xdna_serve_rejects_bad_model_dir(tmp_path, capsys):
    from torch_xdna.cli.main import main
    assert main(["serve", "--model", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_tiny_sampling_values_answer_200_with_a_real_model(live):
    """temperature/top_p of 1e-300 made the sampler divide into inf/NaN probabilities (500); now
    they act as greedy: the same text as temperature 0."""
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4, "seed": 3}
    greedy = httpx.post(live.url + "/v1/chat/completions", headers=auth, timeout=60,
                        json={**body, "temperature": 0}).json()["choices"][0]["message"]
    for extra in ({"temperature": 1e-300}, {"temperature": 1.0, "top_p": 1e-300},
                  {"temperature": 1e-300, "top_p": 1e-300}):
        r = httpx.post(live.url + "/v1/chat/completions", headers=auth, timeout=60,
                       json={**body, **extra})
        assert r.status_code == 200, (extra, r.text)
        assert r.json()["choices"][0]["message"] == greedy, extra
