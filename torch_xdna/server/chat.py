"""The chat/completions side of the server, behind a small protocol.

The server talks to text generators only through `ChatModel`, so the decoder engine (or a test's
fake model) plugs in without the HTTP layer knowing how tokens are produced. Stop sequences and
max_tokens are enforced here, once, for every model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Protocol, runtime_checkable


@dataclass
class GenerationParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@runtime_checkable
class ChatModel(Protocol):
    """A text generator the server can serve on /v1/chat/completions and /v1/completions."""

    context_length: int

    def encode(self, text: str) -> list[int]:
        """Prompt text -> token ids (with the model's BOS if it uses one)."""
        ...

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """[{"role", "content"}, ...] -> prompt token ids, chat template applied."""
        ...

    def stream(self, prompt_ids: list[int], params: GenerationParams,
               cancelled: Callable[[], bool]) -> Iterator[str]:
        """Generate: yield the text of each new token (may be ""), stop at EOS or max_tokens."""
        ...


@dataclass
class GenerationResult:
    prompt_tokens: int
    completion_tokens: int = 0
    finish_reason: str = "length"


class StopMatcher:
    """Cuts streamed text at the first stop sequence; holds back text that may begin one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.buf = ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """Returns (text safe to emit, stopped)."""
        self.buf += piece
        hits = [i for i in (self.buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buf = self.buf[:min(hits)], ""
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), hold, -1):
                if self.buf.endswith(s[:k]):
                    hold = k
                    break
        cut = len(self.buf) - hold
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out, False

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        return out


def run_generation(model: ChatModel, prompt_ids: list[int], params: GenerationParams,
                   emit: Callable[[str], None], cancelled: Callable[[], bool]) -> GenerationResult:
    """Drive model.stream with stop sequences and the token budget; emit text as it is final."""
    result = GenerationResult(prompt_tokens=len(prompt_ids))
    matcher = StopMatcher(params.stop)
    gen = model.stream(prompt_ids, params, cancelled)
    stopped = False
    try:
        for piece in gen:
            result.completion_tokens += 1
            text, stopped = matcher.feed(piece)
            if text:
                emit(text)
            if stopped or cancelled() or result.completion_tokens >= params.max_tokens:
                break
    finally:
        close = getattr(gen, "close", None)
        if close:
            close()
    if not stopped:
        tail = matcher.flush()
        if tail:
            emit(tail)
    hit_limit = result.completion_tokens >= params.max_tokens and not stopped
    result.finish_reason = "length" if hit_limit else "stop"
    return result


def load_chat_model(model_dir: str | Path) -> ChatModel:
    """A decoder directory served through the decoder engine (torch_xdna.engine.decoder)."""
    try:
        from torch_xdna.engine import decoder
    except ImportError as e:
        raise RuntimeError(f"{model_dir}: serving decoder models needs the decoder engine "
                           f"(torch_xdna.engine.decoder), which is not available ({e})") from None
    return DecoderChatModel(decoder, model_dir)


class DecoderChatModel:
    """Adapter from the decoder engine's API to ChatModel."""

    def __init__(self, decoder_module, model_dir: str | Path):
        loader = getattr(decoder_module, "load_decoder", None) or getattr(decoder_module, "load")
        self.engine = loader(model_dir)
        self.context_length = int(getattr(self.engine, "context_length", None)
                                  or getattr(getattr(self.engine, "spec", None), "max_position", 2048))

    def encode(self, text: str) -> list[int]:
        return list(self.engine.encode(text))

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.engine.chat_prompt(messages))

    def stream(self, prompt_ids, params, cancelled) -> Iterator[str]:
        return self.engine.stream(prompt_ids, max_tokens=params.max_tokens,
                                  temperature=params.temperature, top_p=params.top_p,
                                  seed=params.seed, cancelled=cancelled)

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close:
            close()
