"""The device worker never tokenizes: a resident chat model's prompt is encoded on the server's
thread pool before the generation job is queued, so a huge prompt cannot hold up the device."""
from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.registry import ModelRegistry


class RecordingChat:
    """A fake chat model that records the thread each prompt was tokenized on."""

    context_length = 64

    def __init__(self):
        self.encode_threads: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.encode_threads.append(threading.current_thread().name)
        return [ord(c) % 256 for c in text]

    def chat_prompt(self, messages):
        return self.encode("".join(m["content"] for m in messages))

    def stream(self, prompt_ids, params, cancelled):
        yield from ["ok"] * params.max_tokens


def test_prompt_tokenized_off_the_device_worker():
    chat = RecordingChat()
    reg = ModelRegistry(max_models=2)
    reg.add_object(chat, "chat", "fake-chat")
    with TestClient(create_app(ServerConfig(), registry=reg)) as client:
        worker = client.app.state.server.worker._thread.name
        r = client.post("/v1/completions", json={"model": "fake-chat", "prompt": "hi" * 20,
                                                 "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = client.post("/v1/chat/completions", json={
            "model": "fake-chat", "messages": [{"role": "user", "content": "yo"}],
            "max_tokens": 1})
        assert r.status_code == 200, r.text
    assert len(chat.encode_threads) == 2
    assert worker not in chat.encode_threads, chat.encode_threads
