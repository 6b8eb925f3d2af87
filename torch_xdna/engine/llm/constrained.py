"""Grammar-constrained decoding with llguidance: JSON schemas, "any JSON object", Lark grammars.

Why llguidance: on this host (benchmarks/bench_constrained.py, 32k-token byte-level BPE, a nested
6-field schema) it had the lowest per-token mask overhead and by far the fastest grammar compile of
the three maintained libraries (xgrammar, outlines-core), and it reads tokenizer.json directly, so
no transformers is needed at run time. Masks are applied inside the sampler (a LogitsProcessor:
disallowed tokens get -inf before temperature / top-p), so the output always belongs to the
grammar; when the grammar's language is complete, only EOS is allowed (or the grammar stops).

JSON is generated compactly (no free whitespace): models then spend their tokens on content, and a
random or weak model cannot fill its budget with blanks.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_tokenizers: dict[tuple[int, int, int], Any] = {}
_lock = threading.Lock()
COMPACT = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A schema or grammar llguidance cannot compile; the message says what is wrong."""


@dataclass(frozen=True)
class Grammar:
    """What the output must match. kind: "json_schema" (source: a JSON schema dict),
    "json_object" (any JSON object), or "lark" (source: llguidance Lark text, which may embed
    `%json {schema}`)."""

    kind: str
    source: Any = None

    def lark(self) -> str:
        """The grammar in llguidance's input form."""
        import llguidance
        if self.kind == "lark":
            return str(self.source)
        schema = {"type": "object"} if self.kind == "json_object" else self.source
        if not isinstance(schema, dict):
            raise GrammarError("a JSON schema must be a JSON object")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=COMPACT)


def with_compact(schema: dict) -> dict:
    """The schema with llguidance's compact-separator option (kept if the schema sets its own)."""
    out = dict(schema)
    out["x-guidance"] = {**COMPACT, **out.get("x-guidance", {})}
    return out


def json_lark(schema: dict) -> str:
    """A Lark fragment `%json {...}` for embedding a compact JSON schema in a larger grammar."""
    return "%json " + json.dumps(with_compact(schema))


def ll_tokenizer(tokenizer_json: str, vocab: int, eos: int):
    """llguidance's tokenizer of one model (cached: building it scans the vocabulary)."""
    import llguidance
    key = (hash(tokenizer_json), vocab, eos)
    with _lock:
        tok = _tokenizers.get(key)
        if tok is None:
            tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
            _tokenizers[key] = tok
        return tok


class GrammarProcessor:
    """LogitsProcessor that masks every token the grammar does not allow next."""

    def __init__(self, matcher, vocab: int, eos: int):
        self.m, self.vocab, self.eos = matcher, vocab, eos
        self.words = np.full((vocab + 31) // 32, -1, dtype=np.int32)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        self.m.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        if self.m.is_error():
            raise GrammarError(f"constrained decoding failed: {self.m.get_error()}")
        allowed = np.unpackbits(self.words.view(np.uint8), bitorder="little")[:logits.numel()]
        logits.masked_fill_(torch.from_numpy(allowed == 0), float("-inf"))
        return logits

    def accept(self, token: int) -> None:
        if token != self.eos:
            self.m.consume_token(token)

    def finished(self) -> bool:
        """The grammar can take no further token (its output is complete)."""
        return self.m.is_stopped()


def processor_factory(grammar: Grammar, tokenizer_json: str, vocab: int, eos: int):
    """Compile `grammar` once (GrammarError if invalid) and return a factory of fresh processors
    (one per sequence)."""
    try:
        import llguidance
    except ImportError:
        raise RuntimeError("structured output needs llguidance: pip install 'llguidance>=1.9,<2' "
                           "(the serve extra of torch-xdna)") from None
    tok = ll_tokenizer(tokenizer_json, vocab, eos)
    try:
        lark = grammar.lark()
    except (ValueError, TypeError) as e:
        raise GrammarError(f"invalid JSON schema: {e}") from None
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(lark, tok)
    if is_error:
        raise GrammarError(f"invalid grammar: {msgs[0]}")
    proto = llguidance.LLMatcher(tok, lark)
    if proto.is_error():
        raise GrammarError(f"invalid grammar: {proto.get_error()}")
    return lambda: GrammarProcessor(proto.deep_copy(), vocab, eos)
