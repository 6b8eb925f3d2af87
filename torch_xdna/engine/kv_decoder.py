"""The KV-resident decoder: resident weights, a device KV cache, one Program per forward chunk.

The LLM decoder (engine/llm/decoder.py) and Whisper's decoder (engine/asr/whisper.py) decode the
same way: weights uploaded once; activations, ids, logits and the KV cache preallocated; a
Program built once per rows bucket and reused; the position and valid-row count are launch
scalars in one shared dict, so the token loop neither re-plans nor allocates device memory.
This base holds that loop and the buffer ownership; a subclass builds its Programs.
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.kernels.blocks.operands import OPERANDS
from torch_xdna.engine.llm.kv_cache import KVCache
from torch_xdna.runtime import Device, Program, TensorArg


class ResidentDecoder:
    """Device buffers this decoder owns + `forward(ids)` over a resident KV cache.

    A subclass sets dev, capacity, chunk, vocab, cache, ids (int32 [chunk]) and logits
    ([1, vocab]) and implements chunk_program(rows, last); it allocates through upload()/empty()
    so close() frees everything."""

    dev: Device
    capacity: int                  # KV positions
    chunk: int                     # most tokens one forward chunk takes
    vocab: int
    cache: KVCache
    ids: TensorArg
    logits: TensorArg

    def __init__(self, dev: Device):
        self.dev = dev
        self._owned: list[TensorArg] = []
        self._scalars: dict = {"pos": 0, "n": 1}       # read by every launch when it runs
        self._programs: dict = {}

    # -- memory ----------------------------------------------------------------------------
    def keep(self, a: TensorArg) -> TensorArg:
        """Own `a`: close() frees it."""
        self._owned.append(a)
        return a

    def upload(self, t: torch.Tensor) -> TensorArg:
        return self.keep(self.dev.upload(t))

    def empty(self, shape, dtype: torch.dtype) -> TensorArg:
        return self.keep(self.dev.empty(shape, dtype))

    def close(self) -> None:
        """Free every device buffer this decoder owns."""
        for a in getattr(self, "_owned", []):
            self.dev.free(a.buffer)
        self._owned = []
        self._programs = {}
        OPERANDS.clear()             # sim-side operand copies keep freed storages alive

    @property
    def resident_bytes(self) -> int:
        return sum(a.nbytes for a in self._owned)

    @staticmethod
    def rows_view(arg: TensorArg, rows: int) -> TensorArg:
        """The first `rows` rows of a preallocated [chunk, ...] buffer (a Program's bucket)."""
        return TensorArg(arg.buffer, arg.dtype, (rows,) + arg.shape[1:], arg.strides, arg.offset)

    # -- execution -------------------------------------------------------------------------
    def chunk_program(self, rows: int, last: bool) -> Program:
        """The Program of one forward chunk of `rows` (bucketed) tokens; `last`: the chunk whose
        logits forward() returns."""
        raise NotImplementedError

    def context_error(self, total: int) -> ValueError:
        """The error for a forward() that would hold `total` tokens, past the capacity."""
        return ValueError(f"{total} tokens exceed the KV cache capacity of {self.capacity}")

    def reset(self) -> None:
        self.cache.reset()

    @property
    def position(self) -> int:
        return self.cache.length

    def forward(self, ids: list[int]) -> torch.Tensor:
        """Append `ids` at the current position (chunked), return the last token's fp32 logits."""
        if not ids:
            raise ValueError("forward() needs at least one token")
        pos = self.cache.length
        if pos + len(ids) > self.capacity:
            raise self.context_error(pos + len(ids))
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.vocab})")
        dev, s = self.dev, self._scalars
        for start in range(0, len(ids), self.chunk):
            part = ids[start:start + self.chunk]
            n = len(part)
            dev.write(self.ids.buffer, torch.tensor(part, dtype=torch.int32))
            s["pos"], s["n"] = pos, n
            dev.run_program(self.chunk_program(rows_bucket(n, self.chunk), start + n == len(ids)))
            pos += n
            self.cache.length = pos
        return dev.download(self.logits)[0]
