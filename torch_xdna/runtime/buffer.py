"""Buffer objects (BOs): device-visible memory.

On XDNA the NPU reads system DRAM, so a buffer is host memory plus coherence state. Both backends
expose a host view (a flat uint8 torch tensor); `Device.sync` is where coherence is paid for.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from enum import Enum

import torch

ALIGN = 64  # bytes; keeps every dtype view of a buffer aligned
_ids = itertools.count(1)


class Coherence(Enum):
    CLEAN = "clean"
    HOST_DIRTY = "host-dirty"      # host wrote, device has not seen it (needs sync to device)
    DEVICE_DIRTY = "device-dirty"  # device wrote, host cache is stale (needs sync from device)


def aligned(nbytes: int) -> int:
    return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)


@dataclass(eq=False)
class Buffer:
    """One BO. `host` is its bytes as seen from the CPU; `handle` is backend-private."""

    nbytes: int
    host: torch.Tensor
    handle: object = None
    state: Coherence = Coherence.CLEAN
    id: int = field(default_factory=lambda: next(_ids))
    freed: bool = False
    origin: tuple = ()             # code objects of the allocating callers (runtime/memory.py)
    _flat: dict = field(default_factory=dict, repr=False)   # dtype -> flat typed view of host

    def view(self, dtype: torch.dtype, shape: tuple[int, ...], strides: tuple[int, ...],
             offset: int = 0) -> torch.Tensor:
        """A typed strided view of the host bytes (offset in elements of `dtype`)."""
        flat = self._flat.get(dtype)
        if flat is None:
            # cached for the hot path; built outside inference mode so that a view made while a
            # caller is in inference_mode is not an inference tensor for later in-place writes
            if torch.is_inference_mode_enabled():
                with torch.inference_mode(False):
                    flat = self.host.view(dtype)
            else:
                flat = self.host.view(dtype)
            self._flat[dtype] = flat
        return flat.as_strided(shape, strides, offset)

    def rebind(self, host: torch.Tensor) -> None:
        """Point the buffer at new host memory (a remapped BO, or nothing once freed)."""
        self.host = host
        self._flat.clear()

    def __repr__(self) -> str:
        return f"Buffer(id={self.id}, nbytes={self.nbytes}, state={self.state.value})"


@dataclass(frozen=True, eq=False)
class TensorArg:
    """A launch argument: a strided typed region of a buffer."""

    buffer: Buffer
    dtype: torch.dtype
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    def host_view(self) -> torch.Tensor:
        return self.buffer.view(self.dtype, self.shape, self.strides, self.offset)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True
