"""Image chat through the server with the official clients: openai sending an image_url data URL
to /v1/chat/completions, ollama sending `images` to /api/chat and /api/generate; the answer is the engine's own
greedy answer for the same messages. Bad image input is a 400 whose one-line message names it."""
from __future__ import annotations

import base64
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import client_fixtures as cf  # noqa: E402
from vlm_fixtures import build_vlm, png_b64, sample_image  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore::UserWarning")]
VLM = "tiny-gemma3-vlm"


@pytest.fixture(scope="module")
def live(tmp_path_factory, one_thread):
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    path = tmp_path_factory.mktemp("vlm") / VLM
    build_vlm(path)
    reg = ModelRegistry(max_models=2, max_context=128)
    reg.add_dir(path)
    reg.add_object(cf.ScriptChat("Hello there!"), "chat", "plain")
    with BackgroundServer(create_app(ServerConfig(default_model=False), registry=reg)) as srv:
        srv.registry = reg
        yield srv


def test_openai_image_url_data_url(live):
    import openai
    oai = openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)
    img = sample_image()
    r = oai.chat.completions.create(model=VLM, max_tokens=12, temperature=0, messages=[
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_b64(img)}},
            {"type": "text", "text": "what is this?"}]}])
    assert r.usage.prompt_tokens > 4 and r.usage.completion_tokens >= 1
    text = r.choices[0].message.content
    import ollama
    o = ollama.Client(host=live.url).chat(model=VLM, options={"temperature": 0, "num_predict": 12},
                                           messages=[{"role": "user", "content": "what is this?",
                                                      "images": [png_b64(img)]}])
    assert o.message.content == text          # both APIs: the same prompt, the same tokens
    assert o.prompt_eval_count == r.usage.prompt_tokens
    g = ollama.Client(host=live.url).generate(model=VLM, prompt="what is this?",
                                              images=[png_b64(img)],
                                              options={"temperature": 0, "num_predict": 12})
    assert g.response == text                  # /api/generate: the same chat prompt
    from torch_xdna.engine.llm.generate import GenerationConfig
    reg = live.registry
    eng = reg.get(reg.find(VLM)).engine          # the served engine, asked directly
    own = eng.complete([{"role": "user", "content": [{"type": "image", "image": img},
                                                     {"type": "text", "text": "what is this?"}]}],
                       GenerationConfig(max_tokens=12))
    assert own.text == text and own.usage["prompt_tokens"] == r.usage.prompt_tokens


@pytest.mark.parametrize("url, says", [
    ("https://example.com/cat.png", "http(s) image URLs are not fetched"),
    ("data:image/png;base64,@@@not-base64@@@", "base64 payload is invalid"),
    ("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
     "not an image"),
])
def test_openai_bad_image_is_a_400_naming_it(live, url, says):
    r = httpx.post(live.url + "/v1/chat/completions", json={"model": VLM, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "image_url", "image_url": {"url": url}}]}]})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "messages[0].content[1].image_url" in msg and says in msg and "\n" not in msg


@pytest.mark.parametrize("image, says", [("@@@", "not valid base64"),
                                         (base64.b64encode(b"plain text").decode(), "not an image")])
def test_ollama_bad_image_is_a_400_naming_it(live, image, says):
    r = httpx.post(live.url + "/api/chat", json={"model": VLM, "stream": False, "messages": [
        {"role": "user", "content": "hi", "images": [image]}]})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]
    assert "messages[0].images[0]" in msg and says in msg and "\n" not in msg


def test_text_model_refuses_images(live):
    r = httpx.post(live.url + "/v1/chat/completions", json={"model": "plain", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/png;base64," + png_b64(sample_image())}}]}]})
    assert r.status_code == 400 and "takes text only" in r.json()["error"]["message"]
