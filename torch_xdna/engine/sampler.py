"""Token sampling on the host: repetition penalty, temperature, top-k, top-p, seeded RNG.

temperature 0 means greedy (argmax). The order of the transforms follows the common convention
(penalty, temperature, top-k, top-p), so a seed reproduces the same tokens run to run.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0               # 0: off
    top_p: float = 1.0           # 1: off
    repetition_penalty: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")


class Sampler:
    """Stateful sampler of one generation (owns its RNG)."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self.p = params
        self.gen = torch.Generator()
        self.gen.manual_seed(params.seed if params.seed is not None
                             else int(torch.randint(0, 2**62, ()).item()))

    def __call__(self, logits: torch.Tensor, context: torch.Tensor | None = None) -> int:
        """Pick the next token from fp32 logits [V]; `context` holds the ids seen so far."""
        p = self.p
        x = logits.float()
        if p.repetition_penalty != 1.0 and context is not None and context.numel():
            x = x.clone()
            seen = torch.unique(context)
            s = x[seen]
            x[seen] = torch.where(s > 0, s / p.repetition_penalty, s * p.repetition_penalty)
        if p.temperature == 0:
            return int(torch.argmax(x))
        x = x / p.temperature
        if p.top_k and p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=True)
            probs = torch.softmax(sorted_x, -1)
            cum = torch.cumsum(probs, -1)
            drop = cum - probs >= p.top_p           # keep the smallest prefix reaching top_p
            sorted_x = sorted_x.masked_fill(drop, float("-inf"))
            x = torch.full_like(x, float("-inf")).scatter(0, order, sorted_x)
        probs = torch.softmax(x, -1)
        return int(torch.multinomial(probs, 1, generator=self.gen))
