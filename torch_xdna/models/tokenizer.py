"""Tokenizer of a HF model directory (tokenizer.json via `tokenizers`) and its chat template
(rendered with jinja2 the way HF does), without transformers at run time."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from torch_xdna.models.hf import ModelDirError, read_json


def compile_template(template: str):
    """A chat template compiled the way HF renders it (immutable sandbox, HF's helpers);
    raises jinja2.TemplateSyntaxError for a malformed one."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _token_str(v: Any) -> str | None:
    if isinstance(v, dict):
        return v.get("content")
    return v


class Tokenizer:
    """encode/decode plus the chat template of one model directory."""

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer as _Tok
        d = Path(model_dir)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise ModelDirError(f"{model_dir}: no tokenizer.json (a fast tokenizer file is needed)")
        try:
            self.tok = _Tok.from_file(str(path))
        except Exception as e:                       # tokenizers raises plain Exception
            raise ModelDirError(f"{path}: unreadable tokenizer ({e})",
                                public="tokenizer.json: unreadable tokenizer") from None
        cfg_path = d / "tokenizer_config.json"
        self.config: dict = read_json(cfg_path) if cfg_path.is_file() else {}
        if not isinstance(self.config, dict):
            raise ModelDirError(f"{cfg_path}: expected a JSON object",
                                public="tokenizer_config.json: expected a JSON object")
        template = self.config.get("chat_template")
        if isinstance(template, list):               # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = d / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text()
        self.chat_template: str | None = template
        self.bos_token = _token_str(self.config.get("bos_token"))
        self.eos_token = _token_str(self.config.get("eos_token"))
        self._compiled = None

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """Render `messages` ([{role, content}]) with the model's chat template."""
        if not self.chat_template:
            raise ModelDirError("this model directory has no chat_template (tokenizer_config.json "
                                "or chat_template.jinja); pass a plain prompt instead of messages")
        if self._compiled is None:
            self._compiled = compile_template(self.chat_template)
        return self._compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "",
                                     **extra)
