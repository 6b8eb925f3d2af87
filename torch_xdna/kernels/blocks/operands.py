"""Simulator speed only: derived copies of resident tensors, kept so the simulator does not
recompute them on every token. OPERANDS holds the fp32 (and 2-byte) operand copies of resident
weights and any per-design constant derived from them; KV_MIRROR an fp32 copy of each bf16 KV
cache. Neither changes a result or a counter: they are what the references would compute anyway.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from torch_xdna.kernels import numerics
from torch_xdna.kernels.base import round_up
from torch_xdna.kernels.blocks.weights import dequantize


class OperandCache:
    """Simulator speed only: fp32 operand copies of resident weights, so the sim does not
    re-convert every weight on every token. Keyed by storage address + version counter (a write
    to the buffer bumps it). An entry holds its inputs only weakly: it dies with them (a model
    unloaded from the server frees its weights; a strong reference here kept every unloaded
    model's weights alive), and a dead entry is never used even if a new tensor gets its
    address. Bounded by TORCH_XDNA_SIM_WEIGHT_CACHE_MB (default 3072; 0 disables). No effect on
    counters."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, tuple] = OrderedDict()
        self.bytes = 0

    def budget(self) -> int:
        from torch_xdna.runtime import settings
        mb = settings.get("TORCH_XDNA_SIM_WEIGHT_CACHE_MB")
        return int(mb * 2**20)

    def get(self, tensors: Sequence[torch.Tensor], precision: str, group: int) -> torch.Tensor:
        if precision == "fp32":
            return tensors[0]
        return self.derived((precision, group), tensors,
                            lambda: dequantize(tensors, precision, group))

    def bf16(self, tensors: Sequence[torch.Tensor], precision: str, group: int) -> torch.Tensor:
        """The weight as the core's matmul sees it, in its 2-byte form (bf16 tensor; the same
        values `get` returns in fp32): the stored bf16 weight itself when it holds no
        subnormals, else a flushed copy; int8/int4 dequantized to bf16 (exact: dequantize
        rounds to bf16 values). For host_gemv (decode reads 2 bytes per weight, not 4)."""
        def make() -> torch.Tensor:
            if precision == "bf16":
                return numerics.operand_bf16(tensors[0])
            return dequantize(tensors, precision, group).to(torch.bfloat16)
        return self.derived(("bf16", precision, group), tensors, make)

    def derived(self, tag: tuple, tensors: Sequence[torch.Tensor], make) -> torch.Tensor:
        """make()'s tensor, computed once per content of the resident `tensors` (an operand
        copy, or a per-design constant derived from them such as a sign-folded RoPE table)."""
        try:
            key = tag + tuple((t.data_ptr(), t._version, tuple(t.shape), t.stride())
                              for t in tensors)
        except RuntimeError:          # an inference tensor has no version counter: no caching
            return make()
        hit = self.entries.get(key)
        if hit is not None:
            value, refs, size = hit
            if not any(r.expired() for r in refs):
                return tensors[value] if isinstance(value, int) else value
            self._drop(key)                          # its inputs died; the address was reused
        w = make()
        # an entry that is one of its own inputs (nothing to convert) costs no memory and keeps
        # only the input's position, so it never holds the input alive
        same = next((i for i, t in enumerate(tensors) if w is t), None)
        size = 0 if same is not None else w.numel() * w.element_size()
        self._sweep()
        if self.bytes + size <= self.budget():     # no eviction: cyclic access would thrash
            refs = tuple(StorageWeakRef(t.untyped_storage()) for t in tensors)
            self.entries[key] = (w if same is None else same, refs, size)
            self.bytes += size
        return w

    def _drop(self, key: tuple) -> None:
        self.bytes -= self.entries.pop(key)[2]

    def _sweep(self) -> None:
        """Drop the entries whose inputs died (their buffers were freed and released)."""
        for key in [k for k, e in self.entries.items() if any(r.expired() for r in e[1])]:
            self._drop(key)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0
        KV_MIRROR.clear()


OPERANDS = OperandCache()


class KvMirror:
    """Simulator speed only: an fp32 copy of each bf16 KV cache region, zero past the written
    rows, so attention reads fp32 tiles directly instead of converting and padding the whole
    visible cache on every token (bf16 -> fp32 is exact: the same values). Each call appends the
    rows the block just wrote. An entry is trusted only while its cache's version counter is the
    one it recorded after its own last write and it covers every row before `pos`; anything else
    (another writer, a cache restored or copied) rebuilds it from the cache. An entry holds its
    cache only weakly: it dies with the cache's storage (a batch session's slots are freed when
    the session closes; a strong reference here kept every closed session's KV and its mirror
    alive, ~200 KB per batched chat of the tiny test model), and a dead entry is never trusted
    even if a new cache gets its address. Bounded, with the operand copies, by
    TORCH_XDNA_SIM_WEIGHT_CACHE_MB; cleared with OPERANDS (Decoder.close); `enabled` False turns
    it off (tests compare both paths)."""

    enabled = True
    MIN_ROWS = 256                      # first allocation; grows by doubling up to the capacity

    def __init__(self) -> None:
        self.entries: dict[tuple, list] = {}
        self.bytes = 0

    def rows(self, cache: torch.Tensor, pre_version: int, pos: int, end: int, start: int,
             tkv: int) -> torch.Tensor | None:
        """fp32 keys start..round_up(end, tkv) of `cache` [H, C, D] (bf16) after the caller wrote
        rows pos..end-1 (its version counter was `pre_version` before that write); None when
        the mirror is off or over budget (the caller converts as before)."""
        if not self.enabled or start % tkv:
            return None
        try:
            key = (cache.data_ptr(), tuple(cache.shape), cache.stride(), tkv)
            version = cache._version
        except RuntimeError:           # an inference tensor has no version counter
            return None
        need = round_up(end, tkv)
        e = self.entries.get(key)
        if e is not None and e[0].expired():   # its cache died; this one reuses the address
            e = None
        if e is None:
            self.sweep()
        if e is not None and (e[2] != pre_version or e[3] < pos):
            e[3] = 0                    # stale: rebuild from the cache
            e[1].zero_()
        if e is None or e[1].shape[1] < need:
            h, c, d = cache.shape
            size = min(round_up(c, tkv), max(self.MIN_ROWS, need,
                                             2 * (e[1].shape[1] if e is not None else 0)))
            old = 0 if e is None else e[1].numel() * 4
            if self.bytes - old + h * size * d * 4 > OPERANDS.budget() - OPERANDS.bytes:
                return None
            m = torch.zeros(h, size, d)
            if e is not None:
                m[:, :e[3]] = e[1][:, :e[3]]
                e[1] = m
            else:
                e = self.entries[key] = [StorageWeakRef(cache.untyped_storage()), m, version, 0]
            self.bytes += m.numel() * 4 - old
        m, have = e[1], e[3]
        lo = min(pos, have)
        if have > end:                  # rows past the new end (a reset): back to zero
            m[:, end:have].zero_()
        m[:, lo:end].copy_(cache[:, lo:end])
        e[2], e[3] = version, end
        return m[:, start:need]

    def sweep(self) -> int:
        """Drop the entries whose cache has died; returns how many."""
        dead = [k for k, e in self.entries.items() if e[0].expired()]
        for k in dead:
            self.bytes -= self.entries.pop(k)[1].numel() * 4
        return len(dead)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


KV_MIRROR = KvMirror()
