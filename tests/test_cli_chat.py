"""`xdna chat DIR|URL` with stdin piped: a local tiny Qwen3 directory (answers equal to the
engine's for the same conversation) and a live server (a real `xdna` process reading a pipe;
answers equal to the API's, the history sent each turn), commands, refusals in one line."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from torch_xdna.cli.main import main
from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.registry import ModelRegistry

sys.path.insert(0, str(Path(__file__).parent))
from test_server import WORDS, FakeChat  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "chat-key"
ROOT = Path(__file__).resolve().parents[1]


class Recorder(FakeChat):
    """FakeChat that keeps every conversation it was asked to answer."""

    def __init__(self):
        super().__init__()
        self.seen: list[list[dict]] = []

    def chat_prompt(self, messages, **template_vars):
        self.seen.append([dict(m) for m in messages])
        return super().chat_prompt(messages)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp("chat") / "tiny-qwen3"
    build_model("qwen3", path, seed=4)
    return path


def _chat(monkeypatch, capsys, stdin: str, *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(["chat", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_local_model_two_turns_equal_the_engine(qwen, monkeypatch, capsys):
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    code, out, err = _chat(monkeypatch, capsys, 'hello world\n"""the quick\nbrown fox"""\n/exit\n'
                           'never sent\n', str(qwen), "--max-tokens", "6", "--system", "be brief",
                           "--verbose")
    assert code == 0, err
    engine = load_decoder(qwen, max_context=128)
    try:
        cfg = GenerationConfig(max_tokens=6)
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
        first = engine.complete(msgs, cfg).text
        msgs += [{"role": "assistant", "content": first},
                 {"role": "user", "content": "the quick\nbrown fox"}]
        second = engine.complete(msgs, cfg).text
    finally:
        engine.close()
    assert out == f"{first}\n{second}\n"          # no prompt on a pipe; the answers only
    assert err.count("generated tokens") == 2 and "NPU (modeled)" in err


def test_local_refusal_keeps_chatting(qwen, monkeypatch, capsys):
    long = "hello world " * 40
    code, out, err = _chat(monkeypatch, capsys, f"{long}\n/clear\n/help\nhello\n", str(qwen),
                           "--max-tokens", "3", "--max-context", "32")
    assert code == 0
    assert err.count("xdna chat: error:") == 1 and "KV cache holds 32" in err
    assert "/clear" in err and out.count("\n") == 1      # one answer: the short message's


def test_bad_target_is_one_line(tmp_path, monkeypatch, capsys):
    code, _, err = _chat(monkeypatch, capsys, "hi\n", str(tmp_path / "missing"))
    assert code == 2 and err.startswith("xdna chat: error:") and err.count("\n") == 1
    code, _, err = _chat(monkeypatch, capsys, "hi\n", "http://127.0.0.1:9")
    assert code == 2 and "cannot reach http://127.0.0.1:9" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def live(qwen):
    reg = ModelRegistry(max_models=2)
    reg.add_dir(qwen)
    recorder = Recorder()
    reg.add_object(recorder, "chat", "fake-chat")
    app = create_app(ServerConfig(default_model=False, api_key=KEY), registry=reg)
    with BackgroundServer(app) as srv:
        yield srv, recorder


def test_server_through_a_pipe(live):
    srv, recorder = live
    env = dict(os.environ, XDNA_API_KEY=KEY, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "torch_xdna.cli.main", "chat", srv.url,
                           "--model", "fake-chat", "--max-tokens", "3", "--system", "sys"],
                          input="first\nsecond\n/bye\n", capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    answer = "".join(WORDS[:3])
    assert proc.stdout == f"{answer}\n{answer}\n"
    assert recorder.seen[-1] == [{"role": "system", "content": "sys"},
                                 {"role": "user", "content": "first"},
                                 {"role": "assistant", "content": answer},
                                 {"role": "user", "content": "second"}]


def test_server_default_model_equals_the_api(live, monkeypatch, capsys):
    srv, _ = live
    code, out, err = _chat(monkeypatch, capsys, "hello world\n", srv.url + "/v1", "--api-key",
                           KEY, "--max-tokens", "5", "--verbose")
    assert code == 0, err
    r = httpx.post(srv.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "tiny-qwen3", "max_tokens": 5, "temperature": 0,
                         "messages": [{"role": "user", "content": "hello world"}]}, timeout=60)
    assert out == r.json()["choices"][0]["message"]["content"] + "\n"
    assert "5 generated tokens" in err and "measured on this host" in err


def test_server_refusals(live, monkeypatch, capsys):
    srv, _ = live
    code, _, err = _chat(monkeypatch, capsys, "hi\n", srv.url)          # no key
    assert code == 2 and "401" in err and "API key" in err and err.count("\n") == 1
    code, _, err = _chat(monkeypatch, capsys, "hi\n", srv.url, "--api-key", KEY, "--model", "nope")
    assert code == 2 and "does not serve 'nope'" in err and "tiny-qwen3" in err
    code, out, err = _chat(monkeypatch, capsys, "hi\n", srv.url, "--api-key", KEY,
                           "--max-tokens", "100000")
    assert code == 0 and out == "" and err.count("xdna chat: error:") == 1
