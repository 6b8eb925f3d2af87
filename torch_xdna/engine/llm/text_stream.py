"""Generated tokens to streamed text: the one place stop strings are cut and partial text is held.

A stop string may span tokens, and a token may end inside a multi-byte UTF-8 character, so text
is only sent once it is decided: what could still begin a stop string, and a trailing U+FFFD
(an incomplete byte sequence), wait for the next token. Used by the engine's generation loop
(engine/llm/generate.py), the batch session's text view (engine/llm/batching.py) and the server,
which enforces stop strings on any model's text pieces (server/chat.py). No torch: the server
imports this without the engine's weight.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence


class StopMatcher:
    """Cuts text at the first stop string, also when it spans tokens while streaming: text that
    could still be the start of a stop string is held back until it is decided.

    Two views of one rule: find/safe_len on the whole text so far (the engine re-decodes all
    its tokens each step), feed/flush on pieces as they come (the server's models)."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buf = ""                      # feed(): text received, not yet returned

    def find(self, text: str) -> int:
        """Index where the first stop string starts in `text`, or -1."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else -1

    def safe_len(self, text: str) -> int:
        """How much of `text` can be emitted without risking a stop string split across tokens."""
        n = len(text)
        for k in range(min(self.hold, n), 0, -1):
            tail = text[n - k:]
            if any(s.startswith(tail) for s in self.stops):
                return n - k
        return n

    def feed(self, piece: str) -> tuple[str, bool]:
        """Add the next piece of text; returns (text safe to emit, stopped)."""
        self.buf += piece
        cut = self.find(self.buf)
        if cut >= 0:
            out, self.buf = self.buf[:cut], ""
            return out, True
        cut = self.safe_len(self.buf)
        out, self.buf = self.buf[:cut], self.buf[cut:]
        return out, False

    def flush(self) -> str:
        """The text held back, at the end of the stream."""
        out, self.buf = self.buf, ""
        return out


class TextStream:
    """One generation's tokens in, its decided text pieces out (see the module docstring).

    push() each generated token; a returned string is a piece to send together with take()'s
    tokens (and log-probs) not sent yet. Without a decoder (no tokenizer) every token is sent at
    once with empty text. After a stop string, `stopped` is set and the tokens that produced no
    text are dropped."""

    def __init__(self, decode: Callable[[list[int]], str] | None, stops: Sequence[str]):
        self.decode = decode
        self.stops = StopMatcher(stops)
        self.ids: list[int] = []           # every token pushed
        self.emitted = ""                  # text sent so far
        self.stopped = False
        self._pending: list[int] = []      # tokens not yet sent with a piece
        self._pending_lp: list[Any] = []

    def push(self, token: int, logprob: Any = None, final: bool = False) -> str | None:
        """Add one token; the new decided text, or None when nothing can be sent yet. final: no
        token follows (everything decoded is decided; stop strings are still cut)."""
        self.ids.append(token)
        self._pending.append(token)
        if logprob is not None:
            self._pending_lp.append(logprob)
        if self.decode is None:
            return ""
        text = self.decode(self.ids)
        cut = self.stops.find(text)
        if cut >= 0:
            self.stopped = True
            piece = text[len(self.emitted):cut] if cut > len(self.emitted) else None
            self.emitted = text[:cut]
            if piece is None:
                self.take()
            return piece
        safe = len(text) if final else self.stops.safe_len(text)
        while safe > len(self.emitted) and text[safe - 1] == "\ufffd" and not final:
            safe -= 1                      # incomplete UTF-8 sequence: wait for more bytes
        if safe <= len(self.emitted):
            return None
        piece, self.emitted = text[len(self.emitted):safe], text[:safe]
        return piece

    def rest(self) -> str | None:
        """The text held back, when the generation ran out of tokens (None: nothing left)."""
        if self.decode is None:
            return None
        text = self.decode(self.ids)
        return text[len(self.emitted):] if len(text) > len(self.emitted) else None

    def take(self) -> tuple[list[int], list[Any]]:
        """The tokens (and log-probs) not sent yet; they count as sent from now on."""
        out = self._pending, self._pending_lp
        self._pending, self._pending_lp = [], []
        return out


class ThinkSplit:
    """Reasoning split out of a thinking model's text as it streams: `<think>...</think>` at the
    start of the output (Qwen3, DeepSeek-R1, ...) is reasoning, the rest is content. `opened`: the
    prompt already opened the block (templates that end the generation prompt with `<think>`).
    Text that could still be a tag is held; whitespace around each part of a split output is
    dropped (an output without a think block passes unchanged)."""

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, opened: bool = False):
        self.state = "think" if opened else "start"      # start | think | content
        self.buf = ""
        self.fresh = True                  # no text of the current part emitted yet

    def feed(self, text: str) -> tuple[str, str]:
        """New text -> (reasoning, content) safe to emit now."""
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                head = self.buf.lstrip()
                if head.startswith(self.OPEN):
                    self.buf, self.state, self.fresh = head[len(self.OPEN):], "think", True
                    continue
                if self.OPEN.startswith(head):          # empty, or a tag still arriving
                    return reasoning, content
                self.state, self.fresh = "content", False   # no think block: text as it came
            elif self.state == "think":
                i = self.buf.find(self.CLOSE)
                if i >= 0:
                    reasoning += self._part(self.buf[:i].rstrip())
                    self.buf, self.state, self.fresh = self.buf[i + len(self.CLOSE):], "content", True
                    continue
                keep = next((k for k in range(min(len(self.CLOSE) - 1, len(self.buf)), 0, -1)
                             if self.buf.endswith(self.CLOSE[:k])), 0)
                cut = len(self.buf) - keep
                while cut and self.buf[cut - 1].isspace():     # may be the block's last
                    cut -= 1
                reasoning += self._part(self.buf[:cut])
                self.buf = self.buf[cut:]
                return reasoning, content
            else:
                content += self._part(self.buf)
                self.buf = ""
                return reasoning, content

    def _part(self, text: str) -> str:
        if self.fresh:
            text = text.lstrip()
            self.fresh = not text
        return text

    def flush(self) -> tuple[str, str]:
        """What is held at the end: (reasoning, content)."""
        rest, self.buf = self.buf, ""
        if self.state == "think":
            return self._part(rest.rstrip()), ""
        return "", self._part(rest)
