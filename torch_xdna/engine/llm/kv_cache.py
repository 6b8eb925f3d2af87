"""The KV cache: per layer one K and one V region [kv_heads, capacity, head_dim], preallocated on
the device once and written in place by the attention blocks (no per-token allocation).

Storage (kv_dtype): bf16 (fp32 in the fp32 verification mode), or int8 with one fp32 scale per
(head, token) row in k_scale / v_scale [kv_heads, capacity] (kernels/llm_blocks.quantize_kv).
Capacity policy (one place): without an explicit max_context the cache takes the model's
maximum context, capped so that the KV cache (and the per-position RoPE tables) use at most
KV_BUDGET_SHARE of the device memory left after the weights, rounded down to whole KV tiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from torch_xdna.choices import DEFAULT_KV_DTYPE, KV_DTYPES
from torch_xdna.kernels.blocks.llm import KV_TILE
from torch_xdna.runtime import Device, TensorArg

KV_BUDGET_SHARE = 0.5          # of the memory free after the weights: room for other models/buffers
CAPACITY_QUANTUM = KV_TILE     # capacities are whole multiples of the launch plans' KV unit
MIN_CAPACITY = 256


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, kv_dtype: str = DEFAULT_KV_DTYPE,
                       exact: bool = False) -> int:
    """Bytes one cached position takes over all layers (K and V, int8 scales included)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
    per_row = head_dim + 4 if kv_dtype == "int8" else head_dim * (4 if exact else 2)
    return 2 * layers * kv_heads * per_row


def budget_capacity(per_token: int, free_bytes: int, model_max: int) -> int:
    """The default capacity: the model's maximum, or what KV_BUDGET_SHARE of `free_bytes` holds."""
    fit = int(max(0, free_bytes) * KV_BUDGET_SHARE) // max(1, per_token)
    fit = fit // CAPACITY_QUANTUM * CAPACITY_QUANTUM
    return int(min(model_max, max(fit, min(MIN_CAPACITY, model_max))))


@dataclass
class KVCache:
    """Device-resident K/V regions; `length` is how many positions hold valid entries."""

    k: list[TensorArg]
    v: list[TensorArg]
    capacity: int
    length: int = 0
    kv_dtype: str = DEFAULT_KV_DTYPE
    k_scale: list[TensorArg] = field(default_factory=list)
    v_scale: list[TensorArg] = field(default_factory=list)

    @classmethod
    def allocate(cls, dev: Device, layers: int, kv_heads: int | Sequence[int],
                 head_dim: int | Sequence[int], capacity: int,
                 dtype: torch.dtype = torch.bfloat16, kv_dtype: str = DEFAULT_KV_DTYPE) -> "KVCache":
        """kv_heads / head_dim: one value for every layer, or one per layer (Gemma 4's sliding
        and full-attention layers differ)."""
        heads = list(kv_heads) if isinstance(kv_heads, Sequence) else [kv_heads] * layers
        dims = list(head_dim) if isinstance(head_dim, Sequence) else [head_dim] * layers
        store = torch.int8 if kv_dtype == "int8" else dtype
        k = [dev.empty((h, capacity, d), store) for h, d in zip(heads, dims)]
        v = [dev.empty((h, capacity, d), store) for h, d in zip(heads, dims)]
        ks, vs = [], []
        if kv_dtype == "int8":
            ks = [dev.empty((h, capacity), torch.float32) for h in heads]
            vs = [dev.empty((h, capacity), torch.float32) for h in heads]
        return cls(k, v, capacity, 0, kv_dtype, ks, vs)

    @property
    def buffers(self) -> list[TensorArg]:
        return self.k + self.v + self.k_scale + self.v_scale

    def layer_outputs(self, i: int) -> list[TensorArg]:
        """The cache tensors layer i's attention block writes (after its activation output)."""
        extra = [self.k_scale[i], self.v_scale[i]] if self.kv_dtype == "int8" else []
        return [self.k[i], self.v[i], *extra]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.buffers)

    def reset(self) -> None:
        """Forget the cached positions (entries are overwritten before they are read again)."""
        self.length = 0

    def free(self, dev: Device) -> None:
        for a in self.buffers:
            dev.free(a.buffer)
        self.k, self.v, self.k_scale, self.v_scale = [], [], [], []
