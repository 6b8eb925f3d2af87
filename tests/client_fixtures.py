"""One live server for the client-compatibility tests (tests/test_server_clients*.py): a tiny
random-weight Qwen3 directory whose chat template has Qwen3's tool blocks and its thinking switch,
a scripted chat model that "thinks" and calls a tool, and the bundled embedding model."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from test_server_api import QWEN3_TOOLS_TEMPLATE, SCRIPTED, TIME, WEATHER  # noqa: E402

# the tail of Qwen3's own chat template (Qwen/Qwen3-0.6B tokenizer_config.json): with
# enable_thinking false the template closes an empty think block after the generation prompt
THINK_TAIL = """{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""
QWEN3_TEMPLATE = QWEN3_TOOLS_TEMPLATE[:QWEN3_TOOLS_TEMPLATE.rindex("{%- if add_generation_prompt")] \
    + THINK_TAIL
FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
THOUGHT = "<think>\nThe user wants the weather.\n</think>\n\n"


class ScriptChat:
    """A ChatModel answering a fixed text a few characters per piece; records its prompts and
    template variables (no template: the prompt tool convention)."""

    context_length = 4096

    def __init__(self, text: str):
        self.text = text
        self.prompts: list[list[dict]] = []
        self.template_vars: list[dict] = []

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def chat_prompt(self, messages, **template_vars):
        self.prompts.append(messages)
        self.template_vars.append(template_vars)
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages))

    def stream(self, prompt_ids, params, cancelled):
        for i in range(0, len(self.text), 3):
            yield self.text[i:i + 3]


def build_qwen(path: Path) -> Path:
    import llm_fixtures
    llm_fixtures.build_model("qwen3", path, seed=5)
    text = llm_fixtures.TEXT
    try:
        llm_fixtures.TEXT = text + (json.dumps([WEATHER, TIME]) + SCRIPTED + QWEN3_TEMPLATE) * 10
        llm_fixtures.save_tokenizer(path)
    finally:
        llm_fixtures.TEXT = text
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))      # Qwen2.5-Coder's FIM tokens and
    tok.add_special_tokens(FIM)                                   # Qwen3's think tags (ids < 400)
    tok.add_tokens(["<think>", "</think>"])
    tok.save(str(path / "tokenizer.json"))
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN3_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return path


def start(tmp: Path, **config):
    """(BackgroundServer, registry) serving tiny-qwen3, 'script' (thinks, then calls a tool) and
    'plain' (answers 'Hello there!')."""
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    reg = ModelRegistry(max_models=4)
    reg.add_default_embedding()
    reg.add_dir(build_qwen(tmp / "tiny-qwen3"))
    reg.add_object(ScriptChat(THOUGHT + SCRIPTED), "chat", "script")
    reg.add_object(ScriptChat("Hello there!"), "chat", "plain")
    app = create_app(ServerConfig(default_model=False, **config), registry=reg)
    return BackgroundServer(app), reg


__all__ = ["QWEN3_TEMPLATE", "SCRIPTED", "THOUGHT", "WEATHER", "TIME", "ScriptChat", "start"]
