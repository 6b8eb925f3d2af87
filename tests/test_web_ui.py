"""The chat page at /ui in a real headless Chromium (tests/browser.py, Chrome DevTools protocol)
against a live server: the page loads offline (no CDN, no console error), lists the chat models,
streams an answer typed and sent with real input events, and shows exactly the text the
non-streamed API gives for the same greedy request (one turn and a follow-up turn); Stop, a
refused request, the API-key prompt and the audio upload."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.registry import ModelRegistry
from torch_xdna.server.routes.ui import ASSETS, asset

sys.path.insert(0, str(Path(__file__).parent))
import browser  # noqa: E402
from test_server import WORDS, FakeChat  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
KEY = "ui-key"
MAX_TOKENS = 12
SEEN = """(() => { window.__seen = [];
  new MutationObserver(() => { const a = document.querySelectorAll('.msg.assistant .content');
    if (a.length) window.__seen.push(a[a.length - 1].textContent); })
  .observe(document.getElementById('messages'),
           {subtree: true, childList: true, characterData: true}); })()"""


@pytest.fixture(scope="session")
def chromium():
    reason = browser.ensure_chromium()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from llm_fixtures import build_model
    qwen = tmp_path_factory.mktemp("ui") / "tiny-qwen3"
    build_model("qwen3", qwen, seed=3)
    reg = ModelRegistry(max_models=2)
    reg.add_dir(qwen)
    reg.add_object(FakeChat(delay=0.05), "chat", "slow-chat")
    with BackgroundServer(create_app(ServerConfig(default_model=False), registry=reg)) as srv:
        yield srv


def test_assets_are_packaged_and_local(live):
    for name, media in ASSETS.items():
        text = asset(name).decode()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
        r = httpx.get(f"{live.url}/ui/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == media
        assert "script-src 'self'" in r.headers["content-security-policy"]
    page = httpx.get(live.url + "/ui")
    assert page.status_code == 200 and page.content == asset("index.html")
    assert httpx.get(live.url + "/ui/", follow_redirects=True).url.path == "/ui"
    for bad in ("/ui/nope.js", "/ui/..%2Fapp.py", "/ui/%2e%2e/routes/ui.py"):
        r = httpx.get(live.url + bad)
        assert r.status_code == 404, bad


def _answer(url: str, messages: list[dict], headers: dict | None = None) -> str:
    r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "tiny-qwen3", "messages": messages, "temperature": 0,
        "max_tokens": MAX_TOKENS})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _send(page: browser.Chromium, text: str, by_enter: bool = False) -> dict:
    """Type `text`, send it (click or Enter), wait for the answer; what the page showed."""
    n = page.evaluate("document.querySelectorAll('.msg.assistant').length")
    page.evaluate(SEEN)
    page.type("#input", text)
    if by_enter:
        page.press_enter()
    else:
        page.click("#send")
    page.wait_for(f"document.querySelectorAll('.msg.assistant[data-done]').length > {n}", 60)
    return page.evaluate("""(() => { const a = [...document.querySelectorAll('.msg.assistant')].pop();
        return {text: a.querySelector('.content').textContent, chunks: Number(a.dataset.chunks),
                meta: a.querySelector('.meta').textContent, error: a.classList.contains('error'),
                seen: window.__seen, input: document.getElementById('input').value}; })()""")


def test_page_streams_the_greedy_answer(live, chromium):
    with browser.Chromium() as page:
        page.navigate(live.url + "/ui")
        page.wait_for("document.body.dataset.ready === '1'")
        models = page.evaluate("[...document.querySelectorAll('#model option')].map(o => o.value)")
        assert models == ["tiny-qwen3", "slow-chat"]
        assert page.evaluate("document.getElementById('audio-label').hidden") is True  # no ASR
        page.click("#settings summary")
        page.type("#temperature", "0")
        page.type("#max-tokens", str(MAX_TOKENS))
        first = _send(page, "hello world! how are you today?")
        expected = _answer(live.url, [{"role": "user", "content": "hello world! how are you today?"}])
        assert not first["error"], first["meta"]
        assert first["text"] == expected and expected
        assert first["chunks"] >= 2                       # it arrived in pieces...
        shown = [s for s in dict.fromkeys(first["seen"]) if s]
        assert len(shown) >= 2 and all(expected.startswith(s) for s in shown)   # ...and showed them
        assert first["meta"].startswith(f"{MAX_TOKENS} tokens")
        assert first["input"] == ""
        # a follow-up sent with Enter carries the history
        second = _send(page, "the quick brown fox", by_enter=True)
        history = [{"role": "user", "content": "hello world! how are you today?"},
                   {"role": "assistant", "content": expected},
                   {"role": "user", "content": "the quick brown fox"}]
        assert second["text"] == _answer(live.url, history)
        assert page.errors == []


def test_stop_and_errors_in_the_page(live, chromium):
    with browser.Chromium() as page:
        page.navigate(live.url + "/ui")
        page.wait_for("document.body.dataset.ready === '1'")
        page.evaluate("(() => { const s = document.getElementById('model'); s.value = 'slow-chat';"
                      " s.dispatchEvent(new Event('change')); })()")
        page.type("#input", "go on")
        page.click("#send")
        page.wait_for("Number(document.querySelector('.msg.assistant').dataset.chunks) >= 2")
        page.click("#stop")
        page.wait_for("document.querySelector('.msg.assistant[data-done]') !== null")
        meta = page.evaluate("document.querySelector('.msg.assistant .meta').textContent")
        assert meta == "stopped"
        # a refused request: one line in the page, the message given back for a retry
        page.click("#settings summary")
        page.type("#max-tokens", "0")
        page.type("#input", "again")
        page.click("#send")
        page.wait_for("document.querySelector('.msg.assistant.error') !== null")
        status = page.evaluate("document.getElementById('status').textContent")
        assert "max_tokens" in status and "\n" not in status
        assert page.evaluate("document.getElementById('input').value") == "again"
        assert not [e for e in page.errors if "400" not in e]    # only the refused request


def test_page_asks_for_the_api_key(chromium):
    reg = ModelRegistry(max_models=1)
    reg.add_object(FakeChat(), "chat", "fake-chat")
    app = create_app(ServerConfig(default_model=False, api_key=KEY), registry=reg)
    with BackgroundServer(app) as srv, browser.Chromium() as page:
        assert httpx.get(srv.url + "/ui").status_code == 200         # the page needs no key
        page.navigate(srv.url + "/ui")
        page.wait_for("document.getElementById('status').textContent.includes('API key')")
        assert page.evaluate("document.getElementById('settings').open") is True
        page.type("#api-key", KEY)
        page.evaluate("document.getElementById('api-key')"
                      ".dispatchEvent(new Event('change'))")
        page.wait_for("document.body.dataset.ready === '1'")
        page.type("#max-tokens", "3")
        shown = _send(page, "hi")
        assert not shown["error"] and shown["text"] == "".join(WORDS[:3])


class HeardTranscriber:
    """An ASR model answering how much audio it was given (the Whisper engine itself is tested
    in test_whisper_serve.py; here the page's upload path is)."""

    def transcribe(self, samples, options, name=None):
        from types import SimpleNamespace
        return SimpleNamespace(text=f" heard {len(samples) / 16000:.2f} s of audio",
                               stats=SimpleNamespace(modeled_total_ms=0.0, tokens=5))


def test_audio_upload_fills_the_message(chromium, tmp_path):
    """With an ASR model served the page offers Audio; a chosen file goes through
    /v1/audio/transcriptions (decoded, resampled) and its text lands in the message box."""
    import soundfile as sf
    from whisper_fixtures import tone
    sf.write(tmp_path / "clip.wav", tone(1.5, 24000, seed=5), 24000)
    reg = ModelRegistry(max_models=2)
    reg.add_object(FakeChat(), "chat", "fake-chat")
    reg.add_object(HeardTranscriber(), "asr", "whisper")
    app = create_app(ServerConfig(default_model=False), registry=reg)
    with BackgroundServer(app) as srv, browser.Chromium() as page:
        page.navigate(srv.url + "/ui")
        page.wait_for("document.body.dataset.ready === '1'")
        assert page.evaluate("document.getElementById('audio-label').hidden") is False
        page.type("#input", "note:")
        page.set_files("#audio", [str(tmp_path / "clip.wav")])
        page.wait_for("document.body.dataset.transcribed === '1'", 60)
        assert page.evaluate("document.getElementById('input').value") == \
            "note: heard 1.50 s of audio"
        assert page.evaluate("document.getElementById('status').textContent") == ""
        assert page.errors == []


def test_chromium_is_installed_when_missing(tmp_path, monkeypatch):
    """ensure_chromium's own path, with a fake apt-get on PATH: the first install fails (no
    package lists on a fresh image), update, install again; no apt-get: a one-line reason."""
    target = tmp_path / "chromium"
    log = tmp_path / "apt.log"
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {log}
case "$1" in
  update) touch {tmp_path}/lists ;;
  install) [ -e {tmp_path}/lists ] || exit 100
           printf '#!/bin/sh\\n' > {target}; chmod +x {target} ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setattr(browser, "CHROMIUM", str(target))
    monkeypatch.setattr(browser.os, "geteuid", lambda: 0)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert browser.ensure_chromium() is None and os.access(target, os.X_OK)
    assert log.read_text().splitlines() == [
        "install -y -q --no-install-recommends chromium", "update -q",
        "install -y -q --no-install-recommends chromium"]
    assert browser.ensure_chromium() is None and len(log.read_text().splitlines()) == 3
    target.unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    reason = browser.ensure_chromium()
    assert reason.startswith("no /") and "no apt-get" in reason and "\n" not in reason
