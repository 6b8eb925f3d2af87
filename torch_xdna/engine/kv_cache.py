"""The KV cache: per layer one K and one V region [kv_heads, capacity, head_dim], preallocated on
the device once and written in place by the attention blocks (no per-token allocation)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from torch_xdna.runtime import Device, TensorArg


@dataclass
class KVCache:
    """Device-resident K/V regions; `length` is how many positions hold valid entries."""

    k: list[TensorArg]
    v: list[TensorArg]
    capacity: int
    length: int = 0

    @classmethod
    def allocate(cls, dev: Device, layers: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.bfloat16) -> "KVCache":
        shape = (kv_heads, capacity, head_dim)
        k = [dev.empty(shape, dtype) for _ in range(layers)]
        v = [dev.empty(shape, dtype) for _ in range(layers)]
        return cls(k, v, capacity)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)

    def reset(self) -> None:
        """Forget the cached positions (entries are overwritten before they are read again)."""
        self.length = 0

    def free(self, dev: Device) -> None:
        for a in self.k + self.v:
            dev.free(a.buffer)
        self.k, self.v = [], []
