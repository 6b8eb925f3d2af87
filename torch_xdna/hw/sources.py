"""A value with the place it was taken from, so every hardware fact can be re-checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A named hardware fact: its value and where the figure comes from."""

    value: T
    source: str

    def __repr__(self) -> str:  # compact in tables
        return f"{self.value!r} [{self.source}]"
