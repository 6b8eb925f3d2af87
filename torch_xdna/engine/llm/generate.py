"""Text generation on the fused decoder: prompt or chat messages in, streamed text pieces out.

API (used by the CLI and the server):
    engine = load_decoder("path/to/hf-dir", precision="bf16")
    for chunk in engine.generate("Hello", GenerationConfig(max_tokens=32)): print(chunk.text, end="")
    result = engine.complete([{"role": "user", "content": "Hi"}], GenerationConfig(temperature=0.7))
    result.text, result.finish_reason ("stop" | "length"), result.usage, result.stats
    GenerationConfig(n=3, grammar=Grammar("json_object"), logprobs=5, presence_penalty=0.5, ...)
        n samples after ONE prefill (chunks carry their sample's `index`), grammar-constrained
        output (engine/llm/constrained.py), per-token log-probabilities (Chunk.logprobs)

One generation at a time per engine (the server serializes requests on one worker thread); a
concurrent call raises EngineBusy instead of corrupting the KV cache.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import torch

from torch_xdna.records import Record
from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.engine.llm.decoder import (
    DEFAULT_LAYOUT, ContextOverflow, Decoder, PrecisionPolicy, check_fits, default_cache_dir,
    resolve_capacity,
)
from torch_xdna.engine.llm.constrained import Grammar
from torch_xdna.engine.llm.logits import ProcessorFactory, make_processors
from torch_xdna.engine.llm.sampler import SEED_MAX, SEED_MIN, Sampler, SamplingParams, TokenLogprob
from torch_xdna.engine.llm.prefix_cache import PrefixCache, default_max_bytes
from torch_xdna.engine.llm.text_stream import StopMatcher, TextStream  # noqa: F401 - StopMatcher re-exported
from torch_xdna.engine.counters import CounterDelta
from torch_xdna.models.loader import ModelFiles, load_weights, read_model
from torch_xdna.models.tokenizer import Tokenizer
from torch_xdna.runtime import Device, get_device

if TYPE_CHECKING:
    from torch_xdna.engine.precision_auto import Budget

Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]


class EngineBusy(RuntimeError):
    """A generation is already running on this engine."""


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate. temperature 0 = greedy; stop strings are cut from the output exactly."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] | None = None     # None: the model's eos tokens
    chat_kwargs: tuple = ()                           # extra chat-template variables (k, v) pairs
    presence_penalty: float = 0.0                     # OpenAI's, over the generated tokens
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()    # (token id, bias) pairs
    grammar: Grammar | None = None                    # the output must match it
    processors: tuple[ProcessorFactory, ...] = ()     # more logits processors (factories)
    logprobs: int | None = None                       # None: off; k: log-probs + top-k each token
    n: int = 1                                        # samples of one prompt (one prefill)

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.repetition_penalty,
                              self.seed)


@dataclass
class GenerationStats(Record):
    """measured_*: wall clock on this host. modeled_*: the simulator's NPU cost model (or 0 on
    hardware backends, which report no modeled time)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0            # prompt tokens whose KV came from the prefix cache
    generated_tokens: int = 0
    measured_ttft_s: float = 0.0
    measured_decode_tok_s: float = 0.0
    measured_total_s: float = 0.0
    modeled_prefill_us: float = 0.0
    modeled_prefill_tok_s: float = 0.0
    modeled_decode_ms_per_token: float = 0.0
    modeled_decode_tok_s: float = 0.0
    dispatches_per_token: float = 0.0
    launches_per_token: float = 0.0
    mb_per_token: float = 0.0


@dataclass
class Chunk:
    """One streamed piece: new text (possibly empty), the tokens it came from; the last chunk has
    finish_reason and stats set."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: GenerationStats | None = None
    index: int = 0                                    # which of the n samples
    logprobs: list[TokenLogprob] | None = None        # one per token_ids entry (when asked)


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: dict
    stats: GenerationStats


class Engine:
    """A loaded decoder + tokenizer. See the module docstring for the API."""

    def __init__(self, files: ModelFiles, decoder: Decoder, tokenizer: Tokenizer | None):
        self.files, self.decoder, self.tokenizer = files, decoder, tokenizer
        self.spec = files.spec
        eos = list(files.eos_token_ids())
        if tokenizer is not None:
            t = tokenizer.token_id(tokenizer.eos_token)
            if t is not None and t not in eos:
                eos.append(t)
        self.eos_token_ids = tuple(eos)
        self._lock = threading.Lock()
        self._tok_json: str | None = None      # tokenizer.json text, for grammar compilation
        self.prefix_cache: PrefixCache | None = None      # set by load_decoder (prefix_cache=)
        self._tokens: tuple[list[int], list[int]] = ([], [])   # prompt, generated of the last run
        self._reused = 0                                  # prompt tokens restored from the prefix cache

    @property
    def model_name(self) -> str:
        return self.files.path.name

    def close(self) -> None:
        """Free the device memory of this engine (weights, KV cache) and its prefix cache."""
        self.decoder.close()
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    # -- prompts ---------------------------------------------------------------------------
    def encode_prompt(self, prompt: Prompt, chat_kwargs: Mapping | None = None) -> list[int]:
        """Token ids of a text prompt, a list of ids, or chat messages (via the chat template)."""
        if isinstance(prompt, str):
            return self._tok().encode(prompt)
        items = list(prompt)
        if items and all(isinstance(t, int) for t in items):
            return [int(t) for t in items]
        if items and all(isinstance(m, Mapping) for m in items):
            text = self._tok().apply_chat_template([dict(m) for m in items],
                                                   add_generation_prompt=True, **dict(chat_kwargs or {}))
            return self._tok().encode(text, add_special_tokens=False)
        raise ValueError("prompt must be a string, a list of token ids or a list of "
                         "{'role', 'content'} messages")

    def _tok(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.files.path}: no tokenizer.json; pass token ids instead of text")
        return self.tokenizer

    # -- generation ------------------------------------------------------------------------
    def generate(self, prompt: Prompt, config: GenerationConfig | None = None,
                 cancelled: Callable[[], bool] | None = None) -> Iterator[Chunk]:
        """Stream the continuation of `prompt` as Chunks; the last one carries finish_reason and
        stats. Prompt and config errors raise here; EngineBusy at the first next() if another
        generation is running. Close the iterator to stop early; or pass `cancelled`, checked
        before every token (also ones that yield no text yet), which ends the stream with
        finish_reason "cancelled" (the server's client went away, or it is shutting down)."""
        config = config or GenerationConfig()
        if config.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {config.max_tokens}")
        config.sampling().validate()
        if config.n < 1:
            raise ValueError(f"n must be >= 1, got {config.n}")
        ids = self.encode_prompt(prompt, dict(config.chat_kwargs))
        if not ids:
            raise ValueError("the prompt encodes to zero tokens; pass some text")
        if len(ids) >= self.decoder.capacity:
            raise ContextOverflow(f"the prompt has {len(ids)} tokens; the KV cache holds "
                                  f"{self.decoder.capacity} (raise max_context, "
                                  f"or --max-context on the command line)")
        return self._run(ids, config, cancelled, self.prefill_for(ids))

    def prefill_for(self, ids: list[int]) -> Callable[[list[int]], torch.Tensor] | None:
        """A prompt's own prefill (ids -> last logits) instead of decoder.forward, or None. A
        subclass's (images: engine/llm/vlm.py) runs from position 0, outside the prefix cache."""
        return None

    def _run(self, ids: list[int], config: GenerationConfig,
             cancelled: Callable[[], bool] | None = None,
             prefill: Callable[[list[int]], torch.Tensor] | None = None) -> Iterator[Chunk]:
        # taken at the first next(), so an iterator that is never started holds nothing
        if not self._lock.acquire(blocking=False):
            raise EngineBusy("a generation is already running on this engine; finish or close "
                             "its iterator first (the engine serves one request at a time)")
        try:
            yield from self._loop(ids, config, cancelled or (lambda: False), prefill)
        finally:
            try:
                if self.prefix_cache is not None and prefill is None:   # keep this run's KV
                    prompt, generated = self._tokens
                    self.prefix_cache.store(self.decoder.dev, self.decoder.cache,
                                            prompt + generated)
            finally:
                self._lock.release()

    def grammar_processor(self, grammar: Grammar) -> ProcessorFactory:
        """Compile `grammar` for this model's tokenizer (GrammarError if it is invalid)."""
        from torch_xdna.engine.llm.constrained import processor_factory
        tok = self._tok()
        if not self.eos_token_ids:
            raise ValueError(f"{self.files.path}: no EOS token; constrained output needs one")
        if self._tok_json is None:              # serialized once: it keys a cache
            self._tok_json = tok.tok.to_str()
        return processor_factory(grammar, self._tok_json, self.spec.vocab, self.eos_token_ids[0])

    def _processors(self, config: GenerationConfig) -> Callable[[], list]:
        """A factory of one sequence's logits processors (grammar compiled once for all n)."""
        factories = list(config.processors)
        if config.grammar is not None:
            factories.append(self.grammar_processor(config.grammar))
        bias = dict(config.logit_bias)
        return lambda: make_processors(factories, config.presence_penalty,
                                       config.frequency_penalty, bias, self.spec.vocab)

    def _loop(self, prompt: list[int], config: GenerationConfig, cancelled: Callable[[], bool],
              prefill: Callable[[list[int]], torch.Tensor] | None = None) -> Iterator[Chunk]:
        """Prefill once, then decode the n samples one after another from the prompt's KV entries
        (positions past the prompt are overwritten before they are read, so rewinding the cache
        length is all a new sample needs)."""
        dec = self.decoder
        processors = self._processors(config)
        counters = CounterDelta(dec.dev)
        t0 = time.perf_counter()
        reused = self._reused = (self.prefix_cache.restore(dec.dev, dec.cache, prompt)
                                 if self.prefix_cache is not None and prefill is None
                                 else dec.reset() or 0)
        budget = min(config.max_tokens, dec.capacity - len(prompt))
        logits = ((prefill or dec.forward)(prompt[reused:]) if budget > 0 and not cancelled()
                  else None)
        modeled_prefill_us = counters.take()["modeled_us"]
        snap = dec.snapshot_state() if config.n > 1 else None    # linear attention: the states
        for index in range(config.n):
            seed = config.seed
            if seed is not None and index:                 # distinct, reproducible samples
                seed = (seed - SEED_MIN + index) % (SEED_MAX - SEED_MIN + 1) + SEED_MIN
            sampler = Sampler(SamplingParams(config.temperature, config.top_k, config.top_p,
                                             config.repetition_penalty, seed),
                              processors(), config.logprobs)
            if index:
                dec.cache.length = len(prompt)
                dec.restore_state(snap)
                t0 = time.perf_counter()
                counters.take()
            yield from self._sample(prompt, config, sampler, logits, budget, cancelled,
                                    counters, t0, modeled_prefill_us, index)

    def _sample(self, prompt: list[int], config: GenerationConfig, sampler: Sampler,
                logits: torch.Tensor | None, budget: int, cancelled: Callable[[], bool],
                counters: CounterDelta, t0: float, modeled_prefill_us: float,
                index: int) -> Iterator[Chunk]:
        dec, tok = self.decoder, self.tokenizer
        stream = TextStream(tok.decode if tok is not None else None, config.stop)
        stop_ids = set(self.eos_token_ids if config.stop_token_ids is None else config.stop_token_ids)
        stats = GenerationStats(prompt_tokens=len(prompt))
        stats.modeled_prefill_us = modeled_prefill_us
        stats.cached_tokens = self._reused
        want_lp = config.logprobs is not None
        penalty = config.repetition_penalty != 1.0
        context = torch.tensor(prompt, dtype=torch.long) if penalty else None
        generated = stream.ids
        self._tokens = (prompt, generated)
        finish = "length"
        decode_c = {f: 0 for f in CounterDelta.FIELDS}
        t_first = t_last = None
        n_fwd = 0

        def chunk(text: str, finish_reason: str | None = None,
                  st: GenerationStats | None = None) -> Chunk:
            ids, lps = stream.take()
            return Chunk(text, ids, finish_reason, st, index, lps if want_lp else None)

        for step in range(budget):
            if logits is None or cancelled():
                finish = "cancelled"
                break
            token = sampler(logits, context)
            now = time.perf_counter()
            if t_first is None:
                t_first = now
            if token in stop_ids:
                finish = "stop"
                break
            if penalty:                    # the ids seen so far matter only to the penalty
                context = torch.cat([context, torch.tensor([token])])
            done = sampler.finished         # a grammar whose output is complete
            piece = stream.push(token, sampler.last if want_lp else None, final=done)
            if piece is not None:
                yield chunk(piece)
            if stream.stopped or done:
                finish = "stop"
                break
            if step + 1 < budget:
                logits = dec.forward([token])
                t_last = time.perf_counter()
                n_fwd += 1
                for f, v in counters.take().items():
                    decode_c[f] += v
        else:
            finish = "length"
        if finish == "length":
            rest = stream.rest()
            if rest is not None:
                yield chunk(rest)
        total = time.perf_counter() - t0
        steps = n_fwd
        stats.generated_tokens = len(generated)
        stats.measured_total_s = total
        stats.measured_ttft_s = (t_first or time.perf_counter()) - t0
        if steps and t_last is not None and t_first is not None and t_last > t_first:
            stats.measured_decode_tok_s = steps / (t_last - t_first)
        if stats.modeled_prefill_us:
            stats.modeled_prefill_tok_s = (len(prompt) - self._reused) / (stats.modeled_prefill_us * 1e-6)
        if steps:
            stats.modeled_decode_ms_per_token = decode_c["modeled_us"] / steps / 1e3
            if decode_c["modeled_us"]:
                stats.modeled_decode_tok_s = 1e3 / stats.modeled_decode_ms_per_token
            stats.dispatches_per_token = decode_c["dispatches"] / steps
            stats.launches_per_token = decode_c["launches"] / steps
            stats.mb_per_token = decode_c["dram_bytes"] / steps / 1e6
        yield chunk("", finish, stats)

    def complete(self, prompt: Prompt, config: GenerationConfig | None = None) -> Completion:
        """Run `generate` to the end: text, token ids, finish_reason, usage and stats (one
        sample: iterate generate() for n > 1)."""
        if config is not None and config.n != 1:
            raise ValueError("complete() returns one sample; iterate generate() for n > 1")
        parts, ids, last = [], [], None
        for chunk in self.generate(prompt, config):
            parts.append(chunk.text)
            ids += chunk.token_ids
            last = chunk
        stats = last.stats
        usage = {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.generated_tokens,
                 "total_tokens": stats.prompt_tokens + stats.generated_tokens}
        return Completion("".join(parts), ids, last.finish_reason, usage, stats)


def load_decoder(model_dir: str | Path, precision: str | Mapping[str, str] = "native", *,
                 group: int = 0, max_context: int | None = None, prefill_chunk: int = 128,
                 device: Device | None = None, cache_dir: str | Path | None | bool = None,
                 quiet: bool = False, layout: str = DEFAULT_LAYOUT,
                 tokenizer_dir: str | Path | None = None, kv_dtype: str = DEFAULT_KV_DTYPE,
                 prefix_cache: int | None = None, budget: "Budget | str | None" = None,
                 decoder_cls: type[Decoder] = Decoder) -> Engine:
    """Load a HF decoder directory or a llama.cpp GGUF file (Qwen3, Llama, Gemma 3 text) onto
    the device.

    precision: native (bf16; for a GGUF file what its blocks are: Q8_0 -> int8, Q4_0 -> int4 per
    site kind, group 32, else bf16; an MXFP4 checkpoint (gpt-oss) keeps its experts mxfp4) | auto (per site kind, the cheapest modeled precision within
    an accuracy `budget` measured on a calibration text, chosen once and saved beside the model:
    engine/precision_auto.py) | bf16 | int8 | int4 | bfp16 | fp32 (verification mode), or per
    site {'attention': ..., 'mlp': ..., 'head': ..., 'default': ...}. Quantized weights are cached on
    disk under cache_dir (default <$TORCH_XDNA_CACHE_DIR or ~/.cache/torch_xdna>/decoder-weights;
    False disables; trust rules: runtime/cachedir.py).
    max_context: KV cache capacity in tokens (default: the model's maximum, capped by the memory
    budget, engine/llm/kv_cache.py). kv_dtype: KV cache storage, bf16 or int8 (per-token scales).
    layout: "layer" (one launch per layer, the default) or "block" (an attention-block and an
    MLP-block launch per layer; same tokens, more configure points).
    tokenizer_dir: take tokenizer.json (+ chat template) from this directory instead.
    prefix_cache: bytes of KV kept for reuse by later prompts sharing a prefix (engine/
    prefix_cache.py); None: a share of the free device memory, 0 disables (int8 KV: off).
    decoder_cls: the Decoder (sub)class to build (image prompts: engine/llm/image_prefill.py).
    """
    files = read_model(model_dir)             # validates every file before anything is allocated
    g = files.gguf
    if precision == "auto":
        precision = _auto_precision(files.path, group, device, layout, tokenizer_dir, budget, quiet)
    elif precision == "native":
        if g is not None:
            from torch_xdna.engine.llm.gguf_weights import auto_precision
            precision = auto_precision(g, files.spec.layers)
            group = group or (32 if set(precision.values()) & {"int8", "int4"} else 0)
        elif (files.config.get("quantization_config") or {}).get("quant_method") == "mxfp4":
            precision = {"default": "bf16", "mlp": "mxfp4"}     # the experts stay MXFP4
        else:
            precision = "bf16"
    policy = PrecisionPolicy.parse(precision, group)
    device = device or get_device()
    capacity = resolve_capacity(files.spec, policy, device, max_context, prefill_chunk, kv_dtype)
    check_fits(files.spec, policy, capacity, device, prefill_chunk, kv_dtype)
    quantized = any(p in ("int8", "int4", "bfp16", "mxfp4")
                    for p in (policy.attention, policy.mlp, policy.head))
    cdir = None
    if quantized and cache_dir is not False:
        cdir = Path(cache_dir) if cache_dir else default_cache_dir()
    transform, ident = policy.transform_for(files.spec), policy.ident()
    if g is not None:
        from torch_xdna.engine.llm.gguf_weights import dequantized_notes, native_transform
        transform = native_transform(g, files.config, policy, files.spec, transform)
        ident += "+gguf"
    weights = load_weights(files, transform, ident, cdir, quiet=quiet)
    if g is not None:
        report = getattr(transform, "report", None)
        if report:
            report()
        g.notes += dequantized_notes(g)
        _log_notes(g, quiet)
    if tokenizer_dir is not None:
        tok = Tokenizer(tokenizer_dir)
    elif g is not None:
        from torch_xdna.models.formats.gguf import gguf_tokenizer
        tok = gguf_tokenizer(g)
    else:
        tok = Tokenizer(files.path) if (files.path / "tokenizer.json").is_file() else None
    decoder = decoder_cls(files.spec, weights, policy, max_context=capacity,
                      prefill_chunk=prefill_chunk, device=device, layout=layout, kv_dtype=kv_dtype)
    engine = Engine(files, decoder, tok)
    size = default_max_bytes(device) if prefix_cache is None else int(prefix_cache)
    # blocks hold K/V rows only: not int8 KV's scales, nor a linear-attention layer's state
    if size > 0 and kv_dtype == "bf16" and not files.spec.layer_kinds:
        engine.prefix_cache = PrefixCache(size)
    return engine


def _auto_precision(path: Path, group: int, device: Device | None, layout: str,
                    tokenizer_dir, budget: "Budget | str | None", quiet: bool
                    ) -> str | dict[str, str]:
    """precision="auto": the stored or freshly measured choice (engine/precision_auto.py); the
    calibration loads use a context just over the calibration text, uncached weights."""
    import logging
    from torch_xdna.engine.precision_auto import CALIBRATION_TOKENS, choose_decoder, stderr_log
    log = logging.getLogger("torch_xdna.precision").info if quiet else stderr_log
    return choose_decoder(path, lambda p: load_decoder(
        path, p, group=group, max_context=CALIBRATION_TOKENS + 8, device=device, cache_dir=False,
        quiet=True, layout=layout, tokenizer_dir=tokenizer_dir, prefix_cache=0),
        budget=budget, log=log).policy()


def _log_notes(g, quiet: bool) -> None:
    """The GGUF load log: what was mapped exactly and what was dequantized."""
    import logging
    import sys
    log = logging.getLogger("torch_xdna.gguf")
    for note in g.notes:
        log.info("%s: %s", g.path.name, note)
        if not quiet:
            print(f"xdna: {g.path.name}: {note}", file=sys.stderr)
