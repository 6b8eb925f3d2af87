"""Prefix cache: the KV entries of token prefixes seen before (system prompts, earlier chat turns),
kept after a generation and copied back into the KV cache when a later prompt starts with the
same tokens, so only the rest of the prompt is prefilled.

Block granular: a prefix is cut into BLOCK-token blocks, each keyed by a hash chain over the token
ids up to and including it (a block's key names its whole prefix, so equal keys mean equal
contexts and therefore equal KV). Bounded in bytes, least recently used blocks evicted first.
Blocks are host tensors: on XDNA the NPU reads system DRAM, so a restore is a host copy into the
KV buffers plus the cache flush the next launch pays for them (charged by the device's sync).

Why the reuse is exact: the attention block writes position p's K/V from token p and the
entries before it only, and the per-row results of the row-wise kernels do not depend on how the
prompt was chunked (tests/test_prefix_cache.py checks greedy tokens with and without the cache).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Sequence

import torch

from torch_xdna.records import Record
from torch_xdna.engine.llm.kv_cache import KVCache
from torch_xdna.runtime import Device
from torch_xdna.runtime.buffer import Coherence

BLOCK = 64                      # tokens per block: small enough to reuse most of a shared prefix
DEFAULT_BUDGET_FRACTION = 0.1   # default size: this share of the device memory free after loading
DEFAULT_MAX_BYTES = 512 << 20   # ... but at most this much


@dataclass
class PrefixStats(Record):
    """Counters since creation: lookups, tokens reused (prefill skipped), blocks stored/evicted."""

    lookups: int = 0
    hits: int = 0
    reused_tokens: int = 0
    stored_blocks: int = 0
    evicted_blocks: int = 0


@dataclass
class _Entry:
    k: list[torch.Tensor]        # per layer [kv_heads, BLOCK, head_dim]
    v: list[torch.Tensor]
    nbytes: int


def _chain(prev: bytes, ids: Sequence[int]) -> bytes:
    h = hashlib.blake2b(prev, digest_size=16)
    h.update(torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes())
    return h.digest()


@dataclass
class PrefixCache:
    """LRU map block-chain-key -> the KV of that block, at most max_bytes of tensors."""

    max_bytes: int
    block: int = BLOCK
    _blocks: OrderedDict = field(default_factory=OrderedDict, repr=False)
    bytes: int = 0
    stats: PrefixStats = field(default_factory=PrefixStats)

    def __post_init__(self):
        if self.block < 1:
            raise ValueError(f"prefix cache block must be >= 1 token, got {self.block}")
        if self.max_bytes < 0:
            raise ValueError(f"prefix cache size must be >= 0 bytes, got {self.max_bytes}")

    def keys(self, ids: Sequence[int]) -> list[bytes]:
        """Chain keys of the full blocks of `ids`."""
        out, prev = [], b""
        for b in range(len(ids) // self.block):
            prev = _chain(prev, ids[b * self.block:(b + 1) * self.block])
            out.append(prev)
        return out

    def __len__(self) -> int:
        return len(self._blocks)

    def clear(self) -> None:
        self._blocks.clear()
        self.bytes = 0

    # -- use --------------------------------------------------------------------------------
    def restore(self, dev: Device, cache: KVCache, ids: Sequence[int]) -> int:
        """Copy the KV of the longest cached prefix of ids[:-1] (at least one token is left to
        prefill, which produces the logits) into `cache` at position 0; returns its length and
        sets cache.length to it (0: nothing cached, the cache is reset)."""
        self.stats.lookups += 1
        cache.reset()
        hit: list[_Entry] = []
        for key in self.keys(ids[:len(ids) - 1]):
            e = self._blocks.get(key)
            if e is None:
                break
            self._blocks.move_to_end(key)          # parent before child: a child outlives it
            hit.append(e)
        if not hit:
            return 0
        n = len(hit) * self.block
        for layer, (kb, vb) in enumerate(zip(cache.k, cache.v)):
            for arg, part in ((kb, "k"), (vb, "v")):
                dev.read(arg.buffer)                 # coherent host bytes around the copy
                view = arg.host_view()
                for j, e in enumerate(hit):
                    view[:, j * self.block:(j + 1) * self.block].copy_(getattr(e, part)[layer])
                arg.buffer.state = Coherence.HOST_DIRTY   # flushed before the next launch
        cache.length = n
        self.stats.hits += 1
        self.stats.reused_tokens += n
        return n

    def store(self, dev: Device, cache: KVCache, ids: Sequence[int]) -> int:
        """Keep the KV of the full blocks of ids[:cache.length] (the tokens whose entries the
        cache holds); blocks already cached are only touched. Returns blocks added."""
        ids = list(ids[:cache.length])
        added = 0
        per_block = sum(a.nbytes for a in cache.k + cache.v) * self.block // max(cache.capacity, 1)
        if per_block > self.max_bytes:
            return 0
        hosts = None
        chain = self.keys(ids)
        mine = set(chain)
        for b, key in enumerate(chain):
            if key in self._blocks:
                self._blocks.move_to_end(key)
                continue
            if hosts is None:                        # device-written: sync once, then copy
                for a in cache.k + cache.v:
                    dev.read(a.buffer)
                hosts = [(k.host_view(), v.host_view()) for k, v in zip(cache.k, cache.v)]
            s = slice(b * self.block, (b + 1) * self.block)
            ks = [hk[:, s].clone() for hk, _ in hosts]
            vs = [hv[:, s].clone() for _, hv in hosts]
            nbytes = sum(t.numel() * t.element_size() for t in ks + vs)
            if not self._evict(self.bytes + nbytes - self.max_bytes, mine):
                break              # full of this prompt's own earlier blocks: keep the prefix
            self._blocks[key] = _Entry(ks, vs, nbytes)
            self.bytes += nbytes
            added += 1
        self.stats.stored_blocks += added
        return added

    def _evict(self, need: int, keep: set) -> bool:
        """Drop least recently used blocks not in `keep` until `need` bytes are free."""
        for key in [k for k in self._blocks if k not in keep]:
            if need <= 0:
                break
            old = self._blocks.pop(key)
            self.bytes -= old.nbytes
            need -= old.nbytes
            self.stats.evicted_blocks += 1
        return need <= 0


def default_max_bytes(dev: Device) -> int:
    """Default size: DEFAULT_BUDGET_FRACTION of what the device has free, capped."""
    free = max(0, dev.memory_budget - dev.counters.allocated_bytes)
    return int(min(DEFAULT_MAX_BYTES, free * DEFAULT_BUDGET_FRACTION))
