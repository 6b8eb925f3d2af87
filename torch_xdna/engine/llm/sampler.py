"""Token sampling on the host: repetition penalty, logits processors, temperature, top-k, top-p,
seeded RNG.

temperature 0 means greedy (argmax). The order of the transforms follows the common convention
(penalty, processors (presence/frequency penalties, logit_bias, grammar masks: engine/llm/logits.py),
temperature, top-k, top-p), so a seed reproduces the same tokens run to run. Log-probabilities
(when asked for) are those of the distribution after the processors and before temperature: what
the model, penalized and constrained, assigns to each token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from torch_xdna.engine.llm.logits import LogitsProcessor

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1      # what torch.Generator.manual_seed accepts
MIN_TEMPERATURE = 1e-30     # smaller ones act as this: fp32 (normal down to 1.2e-38) can divide by it


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0               # 0: off
    top_p: float = 1.0           # 1: off
    repetition_penalty: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        # written so that NaN fails every check (NaN compares false to everything)
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.repetition_penalty < math.inf:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got "
                             f"{self.repetition_penalty}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed}")


@dataclass
class TokenLogprob:
    """The picked token's log-probability and the `top` most likely alternatives (id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


MAX_TOP_LOGPROBS = 20                      # OpenAI's limit


class Sampler:
    """Stateful sampler of one generation (owns its RNG and its logits processors).

    logprobs: None (off) or how many alternatives to report per token (0..20); the last pick's
    TokenLogprob is in `last`."""

    def __init__(self, params: SamplingParams, processors: Sequence[LogitsProcessor] = (),
                 logprobs: int | None = None):
        params.validate()
        if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {logprobs}")
        self.p = params
        self.processors = list(processors)
        self.logprobs = logprobs
        self.last: TokenLogprob | None = None
        self.gen = torch.Generator()
        self.gen.manual_seed(params.seed if params.seed is not None
                             else int(torch.randint(0, 2**62, ()).item()))

    @property
    def finished(self) -> bool:
        """A processor (a grammar whose language is complete) ends the generation."""
        return any(getattr(q, "finished", lambda: False)() for q in self.processors)

    def __call__(self, logits: torch.Tensor, context: torch.Tensor | None = None) -> int:
        """Pick the next token from fp32 logits [V]; `context` holds the ids seen so far."""
        x = logits.float()
        p = self.p
        if p.repetition_penalty != 1.0 and context is not None and context.numel():
            x = x.clone()
            seen = torch.unique(context)
            s = x[seen]
            x[seen] = torch.where(s > 0, s / p.repetition_penalty, s * p.repetition_penalty)
            x = x.clamp(max=torch.finfo(torch.float32).max)    # a tiny penalty: no inf logits
        if self.processors:
            x = x.clone()
            for q in self.processors:
                x = q(x)
        token = self._pick(x)
        if self.logprobs is not None:
            lp = torch.log_softmax(x, -1)
            top = []
            if self.logprobs:
                v, i = torch.topk(lp, min(self.logprobs, lp.numel()))
                top = [(int(a), float(b)) for a, b in zip(i, v) if b > float("-inf")]
            self.last = TokenLogprob(token, float(lp[token]), top)
        for q in self.processors:
            q.accept(token)
        return token

    def _pick(self, x: torch.Tensor) -> int:
        p = self.p
        if p.temperature == 0:
            return int(torch.argmax(x))
        # shift so the largest logit is 0 before dividing, and keep the divisor a normal fp32
        # number: a tiny temperature (1e-300) then sends the others to -inf (greedy in the limit;
        # ties stay ties) instead of giving inf - inf = NaN probabilities
        x = (x - x.max()) / max(p.temperature, MIN_TEMPERATURE)
        if p.top_k and p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=True)
            probs = torch.softmax(sorted_x, -1)
            cum = torch.cumsum(probs, -1)
            drop = cum - probs >= p.top_p           # keep the smallest prefix reaching top_p
            drop[0] = False                         # and always the top token (a top_p below
            #                                         fp32's range would drop every token)
            sorted_x = sorted_x.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
        probs = torch.softmax(x, -1)
        if not bool(torch.isfinite(probs).all()):   # NaN logits from the model: fail loudly
            raise ValueError("the model produced non-finite logits; the token cannot be sampled")
        return int(torch.multinomial(probs, 1, generator=self.gen))
