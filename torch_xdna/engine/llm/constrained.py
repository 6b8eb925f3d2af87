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

# Bounds on one request's grammar work (issue #32). A schema is checked as data first, without
# recursion: nesting depth of the schema document, JSON values in it, serialized size. Then
# llguidance compiles it under LIMITS: its lexer fuel bounds compile time (~50k fuel/ms by its
# documentation: 1M is ~20 ms), lexer states bound memory (~1-2 kB each: 50k is <= 100 MB), the
# grammar size bounds the rest; verbose_errors off keeps its parser state out of messages.
MAX_SCHEMA_DEPTH = 64              # JSON levels of the schema document (~30 nested objects)
MAX_SCHEMA_VALUES = 20_000
MAX_SCHEMA_BYTES = 256 * 1024
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
              max_lexer_states=50_000, max_grammar_size=100_000, verbose_errors=False)


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
        check_schema(schema)
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
            raise GrammarError(engine_error("the output cannot continue under the grammar",
                                            self.m.get_error()))
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
    limits = llguidance.LLParserLimits(**LIMITS)
    is_error, msgs = llguidance.LLMatcher.validate_grammar_with_warnings(lark, tok, limits=limits)
    if is_error:
        raise GrammarError(engine_error("invalid grammar", msgs[0]))
    proto = llguidance.LLMatcher(tok, lark, limits=limits, log_level=0)
    if proto.is_error():
        raise GrammarError(engine_error("invalid grammar", proto.get_error()))
    probe = GrammarProcessor(proto.deep_copy(), vocab, eos)     # the first token, before any
    try:                                                         # is generated: a grammar with
        probe(torch.zeros(vocab))                                # no valid start is refused
    except GrammarError:
        raise GrammarError("the schema or grammar admits no output: no first token can start "
                           "a valid one (a $ref that refers only to itself?)") from None
    return lambda: GrammarProcessor(proto.deep_copy(), vocab, eos)


def engine_error(what: str, detail: str) -> str:
    """One line in our words from llguidance's message (its first line, bounded)."""
    line = (detail or "").strip().splitlines()[0] if (detail or "").strip() else "no detail"
    if line == "NoExtensionBias":
        line = "no token can extend the output"
    elif "Too many items" in line or "fuel" in line or "limit" in line.lower():
        line = f"the grammar is too complex for this server's limits ({line[:160]})"
    return f"{what}: {line[:240]}"


# --- schema checks before compiling (bounded, iterative: no RecursionError) ---------------------
def check_schema(schema: Any, where: str = "the schema") -> None:
    """Refuse (GrammarError, naming the limit) a schema past MAX_SCHEMA_DEPTH / VALUES / BYTES,
    and one no finite JSON value can match: its required properties, items and $refs form a
    cycle every instance would have to follow forever ({"$ref": "#"}, a -> b -> a, or a required
    property whose schema is the root)."""
    depth, values = _shape(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise GrammarError(f"{where} is nested more than {MAX_SCHEMA_DEPTH} levels deep (the "
                           f"limit of this server); flatten it or use $defs")
    if values > MAX_SCHEMA_VALUES:
        raise GrammarError(f"{where} has more than {MAX_SCHEMA_VALUES} JSON values (the limit "
                           f"of this server); send a smaller schema")
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise GrammarError(f"{where} is {size} bytes as JSON; this server accepts at most "
                           f"{MAX_SCHEMA_BYTES}")
    cycle = _infinite_cycle(schema)
    if cycle:
        raise GrammarError(f"{where} has no finite instance: its required properties and $refs "
                           f"form a cycle ({' -> '.join(map(_shown, cycle))}), so any matching output would be "
                           f"infinitely deep; make a property on the cycle optional")


def _shown(ptr: str) -> str:
    """A JSON pointer as messages show it: '#' -> 'the root', '#/$defs/a' -> '$defs.a'."""
    return "the root" if ptr == "#" else ".".join(ptr[2:].split("/"))


def _shape(doc: Any) -> tuple[int, int]:
    """(nesting depth, number of JSON values) of a JSON document, iteratively; the walk stops
    once either passes its limit."""
    deepest, count, stack = 0, 0, [(doc, 1)]
    while stack:
        item, d = stack.pop()
        count += 1
        deepest = max(deepest, d)
        if d > MAX_SCHEMA_DEPTH or count > MAX_SCHEMA_VALUES:
            return d, count                     # already over a limit: stop walking
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest, count



def _pointer(doc: Any, ref: str) -> Any:
    """The value a local JSON pointer ("#", "#/$defs/a") names, or None."""
    node = doc
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _needs(doc: Any, ptr: str, node: Any) -> tuple[list[str], list[list[str]]] | None:
    """What an instance of `node` must contain: (schemas it must also match, groups of which
    it must match one); None for `false` (nothing matches it)."""
    if node is False:
        return None
    if not isinstance(node, dict):
        return [], []
    must, groups = [], []
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and _pointer(doc, ref) is not None:
        must.append(ref.rstrip("/") or "#")
    for i, _ in enumerate(node.get("allOf") or []):
        must.append(f"{ptr}/allOf/{i}")
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and branches:
            groups.append([f"{ptr}/{key}/{i}" for i in range(len(branches))])
    kind = node.get("type")
    props, required = node.get("properties"), node.get("required")
    if kind in (None, "object", ["object"]) and isinstance(props, dict) \
            and isinstance(required, list):
        for name in required:
            if isinstance(name, str) and name in props:
                esc = name.replace("~", "~0").replace("/", "~1")
                must.append(f"{ptr}/properties/{esc}")
    least = node.get("minItems")
    if kind in ("array", ["array"]) and isinstance(least, int) and least > 0:
        prefix = node.get("prefixItems") if isinstance(node.get("prefixItems"), list) else []
        must += [f"{ptr}/prefixItems/{i}" for i in range(min(least, len(prefix)))]
        if least > len(prefix) and isinstance(node.get("items"), dict):
            must.append(f"{ptr}/items")
    return must, groups


def _infinite_cycle(doc: Any) -> list[str]:
    """The cycle that makes `doc` unsatisfiable by any finite value ([] when it has a finite
    instance, as far as required properties, items and $refs tell). Linear: each schema node
    becomes "finite" once everything it needs is (a worklist, not recursion)."""
    needs: dict[str, tuple] = {}
    todo = ["#"]
    while todo:
        ptr = todo.pop()
        if ptr in needs:
            continue
        node = doc if ptr == "#" else _pointer(doc, ptr)
        needs[ptr] = _needs(doc, ptr, node)
        if needs[ptr] is not None:
            must, groups = needs[ptr]
            todo += must + [b for g in groups for b in g]
    waiting: dict[str, int] = {}
    parents: dict[str, list[tuple[str, int]]] = {}      # child -> (parent, group or -1)
    finite: list[str] = []
    for ptr, need in needs.items():
        if need is None:
            continue
        must, groups = set(need[0]), need[1]
        waiting[ptr] = len(must) + len(groups)
        for child in must:
            parents.setdefault(child, []).append((ptr, -1))
        for gi, group in enumerate(groups):
            for child in group:
                parents.setdefault(child, []).append((ptr, gi))
        if waiting[ptr] == 0:
            finite.append(ptr)
    done: set[str] = set(finite)
    met: set[tuple[str, int]] = set()
    while finite:
        child = finite.pop()
        for parent, gi in parents.get(child, []):
            if parent in done or (gi >= 0 and (parent, gi) in met):
                continue
            if gi >= 0:
                met.add((parent, gi))
            waiting[parent] -= 1
            if waiting[parent] == 0:
                done.add(parent)
                finite.append(parent)
    if "#" in done or needs.get("#") is None:
        return []                    # finite, or `false` (llguidance names that itself)
    path, seen, ptr = [], {}, "#"
    while ptr not in seen and needs.get(ptr) is not None:
        seen[ptr] = len(path)
        path.append(ptr)
        must, groups = needs[ptr]
        stuck = [c for c in must if c not in done] or \
            [g[0] for g in groups if not any(b in done for b in g)]
        if not stuck:
            return []
        ptr = stuck[0]
    return (path[seen[ptr]:] + [ptr]) if ptr in seen else []
