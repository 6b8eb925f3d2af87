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


@dataclass
class Piece:
    """Streamed text from a model. `tokens`: tokens this piece accounts for; a model that knows
    its totals sets `finish_reason` (and `tokens` = the remaining count) on the last piece."""

    text: str
    tokens: int = 1
    finish_reason: str | None = None


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
               cancelled: Callable[[], bool]) -> Iterator[str | Piece]:
        """Generate: yield each new token's text (a str counts as one token) or Pieces; stop at
        EOS or params.max_tokens. Closing the iterator must stop generation."""
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
    """Drive model.stream with stop sequences and the token budget; emit text once it is final."""
    result = GenerationResult(prompt_tokens=len(prompt_ids))
    matcher = StopMatcher(params.stop)
    gen = model.stream(prompt_ids, params, cancelled)
    stopped, model_finish = False, None
    try:
        for piece in gen:
            if isinstance(piece, str):
                piece = Piece(piece)
            result.completion_tokens += piece.tokens
            model_finish = piece.finish_reason or model_finish
            text, stopped = matcher.feed(piece.text)
            if text:
                emit(text)
            if stopped or model_finish or cancelled() \
                    or result.completion_tokens >= params.max_tokens:
                break
    finally:
        close = getattr(gen, "close", None)
        if close:
            close()
    if not stopped:
        tail = matcher.flush()
        if tail:
            emit(tail)
    if stopped:
        result.finish_reason = "stop"
    elif model_finish:
        result.finish_reason = model_finish
    else:
        result.finish_reason = "length" if result.completion_tokens >= params.max_tokens else "stop"
    return result


def load_chat_model(model_dir: str | Path, max_context: int | None = None,
                    kv_dtype: str = "bf16") -> ChatModel:
    """A decoder directory served through the decoder engine (torch_xdna.engine.generate);
    its context limit is the KV capacity (max_context, else the model's maximum within the
    memory budget)."""
    try:
        from torch_xdna.engine.generate import load_decoder
    except ImportError as e:
        raise RuntimeError(f"{model_dir}: serving decoder models needs the decoder engine "
                           f"(torch_xdna.engine.generate), which is not available ({e})") from None
    return DecoderChatModel(load_decoder(model_dir, quiet=True, max_context=max_context,
                                         kv_dtype=kv_dtype))


class DecoderChatModel:
    """ChatModel over the decoder engine (engine.generate.Engine)."""

    def __init__(self, engine):
        self.engine = engine
        self.context_length = int(engine.decoder.capacity)

    def encode(self, text: str) -> list[int]:
        return self.engine.encode_prompt(text)

    def chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return self.engine.encode_prompt(messages)

    def stream(self, prompt_ids: list[int], params: GenerationParams,
               cancelled: Callable[[], bool]) -> Iterator[Piece]:
        from torch_xdna.engine.generate import GenerationConfig
        config = GenerationConfig(max_tokens=params.max_tokens, temperature=params.temperature,
                                  top_p=params.top_p, seed=params.seed, stop=tuple(params.stop))
        for chunk in self.engine.generate(prompt_ids, config, cancelled):
            if chunk.finish_reason is not None:
                # the engine's own count includes tokens cut by a stop string
                yield Piece(chunk.text, chunk.stats.generated_tokens if chunk.stats else 0,
                            chunk.finish_reason)
            else:
                yield Piece(chunk.text, 0)

    def close(self) -> None:
        self.engine.close()
