"""The server under careless and hostile input (issue 15): slow and idle connections, the
connection cap, body timeouts, graceful shutdown, clients that walk away, request parameters
that break the sampler, surrogates, UTF-8 API keys, numeric env vars, server paths in client
errors, failed model loads, and `xdna serve` startup failures. Real uvicorn on 127.0.0.1."""
from __future__ import annotations

import json
import math
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from fastapi.testclient import TestClient

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.http import HttpLimits
from torch_xdna.server.registry import ModelEntry, ModelRegistry

MSG = [{"role": "user", "content": "hi"}]


class CountingChat:
    """A ChatModel that sleeps per token and counts every token it produced."""

    context_length = 100_000

    def __init__(self, delay: float = 0.0):
        self.delay = delay
        self.tokens = 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def chat_prompt(self, messages):
        return self.encode("".join(m["content"] for m in messages))

    def stream(self, prompt_ids, params, cancelled):
        for _ in range(params.max_tokens):
            if self.delay:
                time.sleep(self.delay)
            self.tokens += 1
            yield "tok "


def chat_app(model=None, **config):
    reg = ModelRegistry()
    reg.add_object(model or CountingChat(), "chat", "chat")
    return create_app(ServerConfig(preload=False, **config), registry=reg)


def _recv_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection (or `timeout`)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return data + b"<still open>"
    except ConnectionResetError:
        return data


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


# --- 1. transport limits -------------------------------------------------------------------------
def test_partial_and_missing_headers_time_out_with_408():
    limits = HttpLimits(header_timeout_s=0.5)
    with BackgroundServer(chat_app(limits=limits)) as srv:
        addr = _host_port(srv.url)
        slow = socket.create_connection(addr)
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")     # never finished
        idle = socket.create_connection(addr)                             # never sends
        t0 = time.monotonic()
        got_slow, got_idle = _recv_all(slow, 5), _recv_all(idle, 5)
        assert time.monotonic() - t0 < 4
        for got in (got_slow, got_idle):
            assert got.startswith(b"HTTP/1.1 408 "), got
            assert not got.endswith(b"<still open>")                  # closed by the server
            assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
        # a keep-alive connection that starts a second request and stalls is cut off too
        ka = socket.create_connection(addr)
        ka.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        ka.sendall(b"GET /health HTTP/1.1\r\nHo")
        got = _recv_all(ka, 5)
        assert got.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 408 " in got, got
        assert httpx.get(srv.url + "/health").status_code == 200
        pool = srv.server.config.http_protocol_class.connection_pool
        assert pool.header_timeouts >= 3
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'xdna_rejected_total{reason="header_timeout"} 3' in metrics, metrics
        assert "xdna_connections_open" in metrics
        # headers over --max-header-bytes (16 KiB): 400 and closed, not buffered without end
        big = socket.create_connection(addr)
        big.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (32 << 10))
        got = _recv_all(big, 5)
        assert got.startswith(b"HTTP/1.1 400 ") and not got.endswith(b"<still open>"), got[:80]


def test_client_that_stops_reading_a_stream_is_disconnected_and_generation_stops():
    """A streaming client that never reads: once the socket buffers are full the response
    cannot be written; after --write-timeout the connection is aborted, the generation stops
    (fewer tokens than asked) and the server keeps answering others."""
    class Wordy(CountingChat):                   # 8 KiB per token: 16 MiB if fully read
        def stream(self, prompt_ids, params, cancelled):
            for _ in super().stream(prompt_ids, params, cancelled):
                yield "x" * 8192

    chat = Wordy(delay=0.005)                     # >= 10 s for all 2048 tokens
    with BackgroundServer(chat_app(chat, limits=HttpLimits(write_timeout_s=0.5))) as srv:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a tiny receive window
        sock.connect(_host_port(srv.url))
        body = json.dumps({"model": "chat", "messages": MSG, "max_tokens": 2048,
                           "stream": True}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        pool = srv.server.config.http_protocol_class.connection_pool
        deadline = time.monotonic() + 60
        while pool.write_timeouts == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pool.write_timeouts == 1
        time.sleep(0.5)
        produced = chat.tokens
        time.sleep(0.5)
        assert chat.tokens == produced < 2048                # generation stopped
        assert httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                          json={"model": "chat", "messages": MSG, "max_tokens": 2}).status_code == 200
        assert 'xdna_rejected_total{reason="write_timeout"} 1' in httpx.get(srv.url + "/metrics").text
        sock.close()


def test_serve_options_are_checked(capsys):
    from torch_xdna.cli.main import build_parser
    args = build_parser().parse_args(["serve", "--header-timeout", "2.5", "--max-connections",
                                      "50", "--graceful-timeout", "1", "--write-timeout", "7"])
    assert (args.header_timeout, args.max_connections, args.graceful_timeout,
            args.write_timeout) == (2.5, 50, 1.0, 7.0)
    for bad in (["--header-timeout", "nan"], ["--body-timeout", "0"], ["--keep-alive", "-1"],
                ["--max-connections", "0"], ["--write-timeout", "inf"]):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["serve", *bad])
        assert e.value.code == 2 and bad[0] in capsys.readouterr().err


def test_trickled_body_times_out_with_408():
    with BackgroundServer(chat_app(limits=HttpLimits(body_timeout_s=0.5))) as srv:
        s = socket.create_connection(_host_port(srv.url))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: 1000\r\n\r\n{\"model\": ")
        got = _recv_all(s, 5)
        assert got.startswith(b"HTTP/1.1 408 ") and not got.endswith(b"<still open>"), got
        assert b"request_timeout" in got


def test_connection_cap_evicts_idle_sockets_and_refuses_when_all_busy():
    chat = CountingChat(delay=0.02)
    limits = HttpLimits(max_connections=4, header_timeout_s=30)
    with BackgroundServer(chat_app(chat, limits=limits, max_queue=8)) as srv:
        addr = _host_port(srv.url)
        pool = srv.server.config.http_protocol_class.connection_pool
        idle = [socket.create_connection(addr) for _ in range(4)]
        time.sleep(0.2)
        # at the cap, real clients still get in: the longest-idle sockets make room
        for _ in range(3):
            assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
        assert pool.evicted >= 1 and pool.open <= 4
        assert _recv_all(idle[0], 2) == b""                     # the oldest one was closed
        for s in idle:
            s.close()
        time.sleep(0.2)
        # all 4 connections busy with requests: a 5th connection gets a JSON 503 at once
        body = {"model": "chat", "messages": MSG, "max_tokens": 30}
        with ThreadPoolExecutor(4) as ex:
            busy = [ex.submit(httpx.post, srv.url + "/v1/chat/completions", json=body,
                              timeout=30) for _ in range(4)]
            time.sleep(0.5)
            r = httpx.get(srv.url + "/health", timeout=5)
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "too_many_connections"
            assert all(f.result().status_code == 200 for f in busy)
        assert pool.refused >= 1
        assert httpx.get(srv.url + "/health").status_code == 200


def test_connection_cap_stays_below_the_open_file_limit():
    from torch_xdna.server.http import FD_RESERVE, connection_cap
    assert connection_cap(100_000, nofile=1024) == 1024 - FD_RESERVE
    assert connection_cap(500, nofile=1024) == 500
    with pytest.raises(ValueError, match="header_timeout_s"):
        HttpLimits(header_timeout_s=float("nan")).validate()


# --- graceful shutdown ---------------------------------------------------------------------------
@pytest.mark.parametrize("running", ["stream", "plain"])
def test_shutdown_ends_in_flight_requests_with_json_and_sse_errors(running):
    """One request generating, the other waiting in the device queue when the server is told
    to stop: after the grace period both end in OpenAI's error shape (the stream with an SSE
    error event and [DONE]), not a plain-text 500 or a cut stream."""
    chat = CountingChat(delay=0.02)
    limits = HttpLimits(graceful_timeout_s=0.5)
    srv = BackgroundServer(chat_app(chat, limits=limits))
    srv.__enter__()
    body = {"model": "chat", "messages": MSG, "max_tokens": 2000}
    results: dict = {}

    def plain():
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
        results["plain"] = (r.status_code, r.headers.get("content-type"), r.text)

    def stream():
        with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=30,
                          json={**body, "stream": True}) as r:
            results["stream"] = [ln for ln in r.iter_lines() if ln]

    threads = [threading.Thread(target=plain), threading.Thread(target=stream)]
    if running == "stream":
        threads.reverse()
    for t in threads:
        t.start()
        time.sleep(0.3)
    t0 = time.monotonic()
    srv.__exit__(None, None, None)           # what SIGINT/SIGTERM do: should_exit = True
    for t in threads:
        t.join(30)
    assert time.monotonic() - t0 < 10
    code, ctype, text = results["plain"]
    assert code == 503 and ctype == "application/json", (code, text)
    assert json.loads(text)["error"]["code"] == "shutting_down"
    lines = results["stream"]
    if running == "stream":
        assert lines[-1] == "data: [DONE]", lines[-3:]
        err = json.loads(lines[-2][6:])
        assert any('"content": "tok "' in ln for ln in lines)      # it did stream before
    else:                                   # never started: a JSON 503, no event stream
        err = json.loads(lines[0])
    assert err["error"]["code"] == "shutting_down" and err["error"]["type"] == "server_error"
    assert chat.tokens < 2000


def test_shutdown_answers_requests_whose_device_work_is_stuck():
    """A job that does not reach its next token (a long prefill) still gets its 503 JSON at the
    end of the grace period, instead of uvicorn cancelling it into a plain-text 500."""
    class Stuck(CountingChat):
        def stream(self, prompt_ids, params, cancelled):
            time.sleep(3.0)
            yield "late"
    srv = BackgroundServer(chat_app(Stuck(), limits=HttpLimits(graceful_timeout_s=0.3)))
    srv.__enter__()
    out = {}

    def ask():
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                       json={"model": "chat", "messages": MSG, "max_tokens": 2})
        out["r"] = (r.status_code, r.headers.get("content-type"), r.text, time.monotonic())
    t = threading.Thread(target=ask)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    srv.__exit__(None, None, None)
    t.join(30)
    code, ctype, text, t_answer = out["r"]
    assert code == 503 and ctype == "application/json", text
    assert json.loads(text)["error"]["code"] == "shutting_down"
    assert t_answer - t0 < 2.0


# --- 2. cancellation -----------------------------------------------------------------------------
def test_abandoned_requests_stop_generating_and_do_not_delay_the_next():
    chat = CountingChat(delay=0.01)
    with BackgroundServer(chat_app(chat)) as srv:
        body = {"model": "chat", "messages": MSG, "max_tokens": 2000}     # 20 s each if left
        for _ in range(3):
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=0.3)
        # a streaming client that leaves after the first chunk
        with httpx.stream("POST", srv.url + "/v1/chat/completions", timeout=30,
                          json={**body, "stream": True}) as r:
            next(r.iter_lines())
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=30,
                       json={**body, "max_tokens": 2})
        took = time.monotonic() - t0
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        assert took < 3.0, took
        time.sleep(0.2)
        assert chat.tokens < 400, chat.tokens          # 4 x 2000 if nobody had stopped them
        assert srv.app.state.server.worker.depth == 0


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp("llm") / "tiny-qwen3"
    build_model("qwen3", path)
    return path


def test_engine_generate_stops_at_the_next_token_when_cancelled(tiny_qwen):
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    engine = load_decoder(tiny_qwen, quiet=True, max_context=64)
    try:
        calls = []

        def cancelled() -> bool:                  # checked before prefill, then per token
            calls.append(1)
            return len(calls) > 4
        cfg = GenerationConfig(max_tokens=40, stop_token_ids=())
        chunks = list(engine.generate([1, 2, 3], cfg, cancelled=cancelled))
        assert chunks[-1].finish_reason == "cancelled"
        assert chunks[-1].stats.generated_tokens == 3
    finally:
        engine.close()


# --- 5. request parameters -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    with TestClient(chat_app(api_key=None)) as c:
        yield c


def _post(client, route: str, raw: str):
    return client.post(route, content=raw.encode("utf-8", "surrogatepass"),
                       headers={"Content-Type": "application/json"})


BAD_PARAMS = [
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
     "temperature"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}',
     "top_p"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}',
     "temperature"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "seed": '
     + str(2**70) + "}", "seed"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "seed": -'
     + str(2**64) + "}", "seed"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "presence_penalty": NaN}',
     "presence_penalty"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),
    ('{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stop": ["\\udfff"]}',
     "stop"),
]


@pytest.mark.parametrize("raw,param", BAD_PARAMS)
def test_bad_sampling_values_and_surrogates_are_400_naming_the_parameter(client, raw, param):
    r = _post(client, "/v1/chat/completions", raw)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and f"'{param}" in err["message"], err


def test_surrogates_refused_on_every_route(client):
    for route, raw, param in [
            ("/v1/completions", '{"model": "chat", "prompt": "x\\ud800"}', "prompt"),
            ("/v1/completions", '{"model": "chat", "prompt": ["\\udc00"]}', "prompt"),
            ("/v1/embeddings", '{"input": ["ok", "\\ud83d"]}', "input"),
            ("/v1/chat/completions", '{"model": "chat", "user": "\\ud800", "messages": []}',
             "user")]:
        r = _post(client, route, raw)
        assert r.status_code == 400, (route, r.text)
        err = r.json()["error"]
        assert err["param"] == param and "surrogate" in err["message"], err
    # a properly paired surrogate (an emoji) is ordinary text
    r = _post(client, "/v1/completions", '{"model": "chat", "prompt": "\\ud83d\\ude80", '
                                         '"max_tokens": 1}')
    assert r.status_code == 200, r.text


def test_empty_prompt_message(client):
    for prompt in ('""', '[""]'):
        r = _post(client, "/v1/completions", '{"model": "chat", "prompt": ' + prompt + "}")
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "prompt" and "empty" in err["message"], err


def test_seed_at_the_64_bit_edges_is_accepted(client):
    for seed in (2**64 - 1, -(2**63), 0):
        r = client.post("/v1/chat/completions", json={"model": "chat", "messages": MSG,
                                                      "seed": seed, "max_tokens": 1})
        assert r.status_code == 200, r.text


def test_sampler_is_finite_for_tiny_temperature_and_top_p():
    from torch_xdna.engine.llm.sampler import Sampler, SamplingParams
    torch.manual_seed(0)
    logits = torch.randn(5000) * 4
    want = int(logits.argmax())
    for t, p, rep in [(1e-300, 1.0, 1.0), (1.0, 1e-300, 1.0), (1e-300, 1e-300, 1.0),
                      (5e-324, 0.5, 1.0), (2.0, 1e-45, 1.0), (0.7, 1.0, 1e-300)]:
        s = Sampler(SamplingParams(temperature=t, top_p=p, repetition_penalty=rep, seed=1))
        ctx = torch.tensor([want]) if rep != 1.0 else None
        assert s(logits, ctx) == want, (t, p, rep)
    tie = torch.tensor([1.0, 1.0, 0.0])                # a tiny temperature keeps ties ties
    picks = {Sampler(SamplingParams(temperature=1e-300, seed=i))(tie) for i in range(20)}
    assert picks == {0, 1}
    for bad in ({"temperature": math.nan}, {"temperature": math.inf}, {"top_p": math.nan},
                {"repetition_penalty": math.inf}, {"seed": 2**64}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Sampler(SamplingParams(**bad))


def test_cli_generate_rejects_non_finite_sampling_in_one_line(capsys):
    from torch_xdna.cli.main import main
    for flag, value in (("--temperature", "nan"), ("--top-p", "inf"),
                        ("--repetition-penalty", "-inf")):
        with pytest.raises(SystemExit) as e:
            main(["generate", "/nonexistent", "hi", f"{flag}={value}"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: {value!r} is not allowed" in err and "Traceback" not in err
    assert main(["generate", "/nonexistent", "hi", "--seed", str(2**70)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "seed must be an integer" in err[0]


def test_utf8_api_key_matches_its_bytes():
    key = "clé-🔑-ключ"
    with TestClient(chat_app(api_key=key)) as c:
        ok = {"Authorization": b"Bearer " + key.encode("utf-8")}
        assert c.get("/v1/models", headers=ok).status_code == 200
        bad = {"Authorization": b"Bearer " + key.encode("utf-8")[:-1]}
        assert c.get("/v1/models", headers=bad).status_code == 401
        latin = {"Authorization": b"Bearer " + "clé".encode("latin-1")}
        assert c.get("/v1/models", headers=latin).status_code == 401
    with TestClient(chat_app(api_key="plain")) as c:
        assert c.get("/v1/models", headers={"Authorization": "bearer plain"}).status_code == 200


# --- 6. environment values -----------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-5", "0", "inf", "nan", "lots", "1e400", "0.4"])
def test_memory_budget_env_is_validated(monkeypatch, value):
    from torch_xdna.hw import get_generation
    from torch_xdna.runtime import default_memory_budget
    from torch_xdna.runtime.settings import EnvError
    monkeypatch.setenv("TORCH_XDNA_MEMORY_BUDGET", value)
    with pytest.raises(EnvError, match=r"TORCH_XDNA_MEMORY_BUDGET=.*(bytes|number)") as e:
        default_memory_budget(get_generation("npu4"))
    assert isinstance(e.value, ValueError)            # the CLI reports it in one line, exit 2


def test_numeric_env_values_accept_their_forms(monkeypatch):
    from torch_xdna.hw import get_generation
    from torch_xdna.kernels.blocks.operands import OperandCache as _OperandCache
    from torch_xdna.runtime import default_memory_budget
    from torch_xdna.runtime import settings
    from torch_xdna.runtime.settings import EnvError
    monkeypatch.setenv("TORCH_XDNA_MEMORY_BUDGET", "4e9")
    assert default_memory_budget(get_generation("npu4")) == 4_000_000_000
    monkeypatch.setenv("TORCH_XDNA_SIM_WEIGHT_CACHE_MB", "0")
    assert _OperandCache().budget() == 0
    monkeypatch.setenv("TORCH_XDNA_SIM_WEIGHT_CACHE_MB", "-1")
    with pytest.raises(EnvError, match="TORCH_XDNA_SIM_WEIGHT_CACHE_MB"):
        _OperandCache().budget()
    monkeypatch.setenv("TORCH_XDNA_TIMEOUT_MS", "inf")
    with pytest.raises(EnvError, match="TORCH_XDNA_TIMEOUT_MS='inf' is not allowed"):
        settings.get("TORCH_XDNA_TIMEOUT_MS")
    monkeypatch.setenv("TORCH_XDNA_TIMEOUT_MS", " ")
    assert settings.get("TORCH_XDNA_TIMEOUT_MS", 7) == 7


# --- 4 (serving half). failed loads, server paths ------------------------------------------------
class Resident:
    closed = False

    def close(self):
        self.closed = True


def test_failed_lazy_load_evicts_nothing_and_hides_server_paths():
    from torch_xdna.models.hf import ModelDirError
    reg = ModelRegistry(max_models=1)
    healthy = Resident()
    reg.entries["good"] = ModelEntry("good", "chat", lambda: healthy)

    def broken():
        raise ModelDirError("/srv/secret/models/broken/config.json: hidden_size 7 does not match "
                            "the weights (model.embed_tokens.weight is [32, 64])")
    reg.entries["broken"] = ModelEntry("broken", "chat", broken)
    reg.get(reg.entries["good"])
    with pytest.raises(ModelDirError):
        reg.get(reg.entries["broken"])
    assert reg.loaded_ids() == ["good"] and not healthy.closed and reg.evictions == 0

    with TestClient(create_app(ServerConfig(preload=False), registry=reg)) as c:
        r = c.post("/v1/chat/completions", json={"model": "broken", "messages": MSG})
        assert r.status_code == 500 and "/srv" not in r.text, r.text
        assert r.json()["error"]["code"] == "model_load_failed"
        with c.stream("POST", "/v1/chat/completions", json={"model": "broken", "messages": MSG,
                                                            "stream": True}) as s:
            assert s.status_code == 500 and "/srv" not in s.read().decode()
        assert reg.loaded_ids() == ["good"] and not healthy.closed


def test_engine_errors_reach_clients_without_server_paths():
    class PathLeaker(CountingChat):
        def chat_prompt(self, messages):
            raise ValueError("/home/alice/models/q/tokenizer.json: cannot encode this text")
    with TestClient(chat_app(PathLeaker())) as c:
        r = c.post("/v1/chat/completions", json={"model": "chat", "messages": MSG})
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert msg == ".../tokenizer.json: cannot encode this text", msg


def test_xdna_serve_bad_model_at_startup_is_one_line_exit_2(tiny_qwen, tmp_path, capsys,
                                                            monkeypatch):
    """config.json is fine (the server offers the model), the weights are not: the preload
    fails before uvicorn starts, as one line (it was a 40-line uvicorn traceback, exit 3)."""
    import shutil
    from torch_xdna.cli.main import main
    model = tmp_path / "broken"
    shutil.copytree(tiny_qwen, model)
    (model / "model.safetensors").write_bytes(b'{"not": "safetensors"}')
    monkeypatch.setenv("TORCH_XDNA_BACKEND", "sim")
    rc = main(["serve", "--model", str(model), "--no-default-model", "--port", "0"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln.lower()]
    assert rc == 2, err
    assert len(err) == 1 and err[0].startswith("xdna serve: error:") and "Traceback" not in err[0]
