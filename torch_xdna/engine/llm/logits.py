"""Logits processors: per-generation transforms of the next-token logits, run by the Sampler
before temperature / top-k / top-p.

A processor sees the fp32 logits [V] of the next token, returns them (changed or not), and is told
each token that was picked (`accept`). `finished()` lets a grammar end the generation once its
language is complete. Processors are stateful and belong to one sequence: generation configs carry
factories (zero-argument callables) so every sample of n > 1 gets fresh ones.
"""
from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class LogitsProcessor(Protocol):
    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 logits [V] of the next token -> transformed logits [V] (may be in place)."""
        ...

    def accept(self, token: int) -> None:
        """The token that was picked (after every processor ran)."""
        ...


ProcessorFactory = Callable[[], LogitsProcessor]


class Penalties:
    """OpenAI's presence / frequency penalties over the tokens generated so far:
    logit[t] -= presence * (count[t] > 0) + frequency * count[t]."""

    def __init__(self, presence: float = 0.0, frequency: float = 0.0):
        self.presence, self.frequency = float(presence), float(frequency)
        self.counts: dict[int, int] = {}

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.counts:
            return logits
        ids = torch.tensor(list(self.counts), dtype=torch.long)
        n = torch.tensor(list(self.counts.values()), dtype=torch.float32)
        logits[ids] -= self.presence + self.frequency * n
        return logits

    def accept(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1


class LogitBias:
    """OpenAI's logit_bias: {token id: bias in [-100, 100]} added to the logits; ids outside the
    vocabulary are a ValueError naming the id."""

    def __init__(self, bias: Mapping[int, float], vocab: int):
        bad = [t for t in bias if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"logit_bias names token id {bad[0]}, outside the vocabulary "
                             f"[0, {vocab})")
        self.ids = torch.tensor([int(t) for t in bias], dtype=torch.long)
        self.values = torch.tensor([float(v) for v in bias.values()], dtype=torch.float32)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        logits[self.ids] += self.values
        return logits

    def accept(self, token: int) -> None:
        pass


class MinP:
    """min_p sampling (llama.cpp's and vLLM's request parameter): tokens whose probability is
    below min_p times the most likely token's are dropped. Run with the processors, i.e. before
    temperature, as llama.cpp's default sampler chain orders it (top_k, top_p, min_p, temp)."""

    def __init__(self, min_p: float):
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {min_p}")
        self.min_p = float(min_p)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.min_p <= 0.0:
            return logits
        # p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
        floor = logits.max() + torch.log(torch.tensor(self.min_p, dtype=logits.dtype))
        return logits.masked_fill(logits < floor, float("-inf"))

    def accept(self, token: int) -> None:
        pass


def make_processors(factories: Sequence[ProcessorFactory], presence: float = 0.0,
                    frequency: float = 0.0, logit_bias: Mapping[int, float] | None = None,
                    vocab: int = 0) -> list[LogitsProcessor]:
    """Fresh processors of one sequence: penalties, bias, then the given ones (grammars last, so
    a constraint masks whatever the biases favored)."""
    out: list[LogitsProcessor] = []
    if presence or frequency:
        out.append(Penalties(presence, frequency))
    if logit_bias:
        out.append(LogitBias(logit_bias, vocab))
    out += [f() for f in factories]
    return out
