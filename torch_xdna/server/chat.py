"""The chat/completions side of the server, behind a small protocol.

The server talks to text generators only through `ChatModel`, so the decoder engine (or a test's
fake model) plugs in without the HTTP layer knowing how tokens are produced. Stop sequences and
max_tokens are enforced here, once, for every model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.engine.llm.text_stream import StopMatcher

# fill-in-the-middle tokens (prefix, suffix, middle) of the coder families that have them:
# Qwen2.5-Coder, StarCoder / StarCoder2, DeepSeek-Coder
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
              ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
               "<\uff5cfim\u2581end\uff5c>"))

# what a ChatModel may declare in `features` beyond plain text generation
SAMPLING_FEATURES = ("grammar", "logprobs", "penalties", "n")


@dataclass
class GenerationParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    top_k: int = 0                       # 0: off (Ollama's options set it)
    repetition_penalty: float = 1.0      # multiplicative (Ollama's repeat_penalty)
    min_p: float = 0.0                   # 0: off (llama.cpp / vLLM / Ollama's min_p)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None          # None: off; k: per-token log-probs + top-k
    grammar: Any = None                  # engine.constrained.Grammar: the output must match it
    n: int = 1
    stops_here: bool = False             # cut stop strings here, not in the model, to learn which
    #                                      one matched (Anthropic's stop_sequence)

    def needs(self) -> set[str]:
        """The model features these parameters need ("n" is emulated when missing)."""
        out = set()
        if self.grammar is not None:
            out.add("grammar")
        if self.logprobs is not None:
            out.add("logprobs")
        if self.presence_penalty or self.frequency_penalty or self.logit_bias:
            out.add("penalties")
        return out


@dataclass
class Piece:
    """Streamed text from a model. `tokens`: tokens this piece accounts for; a model that knows
    its totals sets `finish_reason` (and `tokens` = the remaining count) on the last piece.
    `index`: which of the n samples; `logprobs`: TokenLogprob-like (token, logprob, top) items
    of this piece's tokens."""

    text: str
    tokens: int = 1
    finish_reason: str | None = None
    index: int = 0
    logprobs: list | None = None
    cached_tokens: int = 0               # prompt tokens whose KV came from the prefix cache


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
    cached_tokens: int = 0               # prompt tokens served from the prefix cache
    stop_sequence: str | None = None     # the stop string that ended it (params.stops_here)


def run_generation(model: ChatModel, prompt_ids: list[int], params: GenerationParams,
                   emit: Callable[..., None], cancelled: Callable[[], bool]
                   ) -> list[GenerationResult]:
    """Drive model.stream with stop sequences and the token budget; emit(index, text, logprobs)
    text once it is final. n samples: one stream when the model declares "n" (one prefill),
    else n streams in turn (seeds seed, seed+1, ...). Returns one result per sample."""
    n = max(1, params.n)
    results = [GenerationResult(prompt_tokens=len(prompt_ids)) for _ in range(n)]
    if n == 1 or "n" in getattr(model, "features", ()):
        _drive(model, prompt_ids, params, emit, cancelled, results, 0)
        return results
    from dataclasses import replace
    for i in range(n):
        seed = None if params.seed is None else params.seed + i
        _drive(model, prompt_ids, replace(params, n=1, seed=seed), emit, cancelled, results, i)
        if cancelled():
            break
    return results


def _drive(model: ChatModel, prompt_ids: list[int], params: GenerationParams,
           emit: Callable[..., None], cancelled: Callable[[], bool],
           results: list[GenerationResult], base: int) -> None:
    count = max(1, params.n)
    matchers = [StopMatcher(params.stop) for _ in range(count)]
    stopped = [False] * count          # by a stop string
    model_finish: list[str | None] = [None] * count
    gen = model.stream(prompt_ids, params, cancelled)

    def over(i: int) -> bool:
        return stopped[i] or model_finish[i] is not None \
            or results[base + i].completion_tokens >= params.max_tokens

    try:
        for piece in gen:
            if isinstance(piece, str):
                piece = Piece(piece)
            i = piece.index
            r = results[base + i]
            r.cached_tokens = max(r.cached_tokens, piece.cached_tokens)
            if over(i):
                continue
            r.completion_tokens += piece.tokens
            model_finish[i] = piece.finish_reason
            seen = matchers[i].buf + piece.text
            text, stopped[i] = matchers[i].feed(piece.text)
            if stopped[i]:
                r.stop_sequence = min((s for s in params.stop if s in seen), key=seen.find)
            if text or piece.logprobs:
                emit(base + i, text, piece.logprobs)
            if cancelled() or all(over(j) for j in range(count)):
                break
    finally:
        close = getattr(gen, "close", None)
        if close:
            close()
    for i in range(count):
        r = results[base + i]
        if not stopped[i]:
            tail = matchers[i].flush()
            if tail:
                emit(base + i, tail, None)
        if stopped[i]:
            r.finish_reason = "stop"
        elif model_finish[i]:
            r.finish_reason = model_finish[i]
        else:
            r.finish_reason = "length" if r.completion_tokens >= params.max_tokens else "stop"


def load_chat_model(model_dir: str | Path, max_context: int | None = None,
                    kv_dtype: str = DEFAULT_KV_DTYPE,
                    tokenizer_dir: str | Path | None = None, precision: str = "native",
                    budget: Any = None, prefill_chunk: int | None = None) -> ChatModel:
    """A decoder directory served through the decoder engine (torch_xdna.engine.llm.generate);
    its context limit is the KV capacity (max_context, else the model's maximum within the
    memory budget)."""
    try:
        from torch_xdna.engine.llm.generate import load_decoder
    except ImportError as e:
        raise RuntimeError(f"{model_dir}: serving decoder models needs the decoder engine "
                           f"(torch_xdna.engine.llm.generate), which is not available ({e})") from None
    chunk = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    from torch_xdna.models.vlm import is_vlm_dir
    if is_vlm_dir(model_dir):                  # Gemma 3 with its vision tower: image chat
        from torch_xdna.engine.llm.vlm import load_vlm
        load_decoder = load_vlm                # noqa: F811 - the same signature
    return DecoderChatModel(load_decoder(model_dir, quiet=True, max_context=max_context,
                                         kv_dtype=kv_dtype, tokenizer_dir=tokenizer_dir,
                                         precision=precision, budget=budget, **chunk))


def _min_p(min_p: float) -> tuple:
    """The engine's logits-processor factories for min_p (none when it is off)."""
    if not min_p:
        return ()
    from torch_xdna.engine.llm.logits import MinP
    return (lambda: MinP(min_p),)


class DecoderChatModel:
    """ChatModel over the decoder engine (engine.generate.Engine)."""

    features = frozenset(SAMPLING_FEATURES)

    def __init__(self, engine):
        self.engine = engine
        self.context_length = int(engine.decoder.capacity)
        tok = engine.tokenizer
        self.chat_template = tok.chat_template if tok is not None else None
        self.accepts_images = bool(getattr(engine, "accepts_images", False))

    def encode(self, text: str) -> list[int]:
        return self.engine.encode_prompt(text)

    def chat_prompt(self, messages: list[dict], **template_vars) -> list[int]:
        return self.engine.encode_prompt(messages, template_vars or None)

    def fim_prompt(self, prefix: str, suffix: str) -> list[int] | None:
        """Fill-in-the-middle prompt ids (prefix-suffix-middle order) when the tokenizer has one
        convention's FIM tokens as single tokens, else None."""
        tok = self.engine.tokenizer
        for names in FIM_TOKENS:
            ids = [tok.token_id(n) for n in names]
            if all(i is not None for i in ids):
                p, s, m = ids
                head = self.engine.encode_prompt("")[:1]            # the BOS, if it uses one
                return head + [p] + tok.encode(prefix, add_special_tokens=False) + [s] + \
                    tok.encode(suffix, add_special_tokens=False) + [m]
        return None

    def token_text(self, token: int) -> str:
        """One token's text (special tokens included), for logprobs."""
        return self.engine.tokenizer.decode([token], skip_special_tokens=False)

    def check_grammar(self, grammar) -> None:
        """Compile `grammar` now (a GrammarError is the client's 400), cached for the run."""
        self.engine.grammar_processor(grammar)

    def generation_config(self, params: GenerationParams):
        """The engine's GenerationConfig for these request parameters."""
        from torch_xdna.engine.llm.generate import GenerationConfig
        return GenerationConfig(max_tokens=params.max_tokens, temperature=params.temperature,
                                top_p=params.top_p, seed=params.seed,
                                stop=() if params.stops_here else tuple(params.stop),
                                top_k=params.top_k,
                                repetition_penalty=params.repetition_penalty,
                                presence_penalty=params.presence_penalty,
                                frequency_penalty=params.frequency_penalty,
                                logit_bias=params.logit_bias, grammar=params.grammar,
                                logprobs=params.logprobs, n=max(1, params.n),
                                processors=_min_p(params.min_p))

    def stream(self, prompt_ids: list[int], params: GenerationParams,
               cancelled: Callable[[], bool]) -> Iterator[Piece]:
        chunks = self.engine.generate(prompt_ids, self.generation_config(params), cancelled)
        return self.pieces(chunks, params.stops_here)

    @staticmethod
    def pieces(chunks, each: bool = False) -> Iterator[Piece]:
        """Engine Chunks -> Pieces (the last one carries the engine's token counts). each: count
        every chunk's tokens as it comes (the server may stop reading before the last one)."""
        counted: dict[int, int] = {}
        try:
            for chunk in chunks:
                n = len(chunk.token_ids) if each else 0
                if chunk.finish_reason is not None:
                    # the engine's own count includes tokens cut by a stop string
                    total = chunk.stats.generated_tokens if chunk.stats else 0
                    yield Piece(chunk.text, total - counted.get(chunk.index, 0),
                                chunk.finish_reason, chunk.index, chunk.logprobs,
                                chunk.stats.cached_tokens if chunk.stats else 0)
                else:
                    counted[chunk.index] = counted.get(chunk.index, 0) + n
                    yield Piece(chunk.text, n, index=chunk.index, logprobs=chunk.logprobs)
        finally:
            close = getattr(chunks, "close", None)
            if close:
                close()

    def close(self) -> None:
        self.engine.close()
