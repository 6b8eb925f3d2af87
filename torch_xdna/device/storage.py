"""Storage of xdna tensors: a runtime Buffer kept as an attribute of the tensor's untyped storage.

The TensorImpl is a real PrivateUse1 tensor with an empty (data_ptr 0) storage; the payload lives
on `untyped_storage()._xdna_buf`, which survives detach, aliasing, views and Parameter creation.
Sizes and strides are set through Meta kernels, which alias storage without touching data.
"""
from __future__ import annotations

import weakref

import torch

from torch_xdna.runtime import Buffer, TensorArg, get_device

META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
aten = torch.ops.aten

# dtypes the NPU has no use for at all: refused at allocation, before any buffer exists
REFUSED_DTYPES = {torch.complex32, torch.complex64, torch.complex128}


class UnsupportedDtype(TypeError):
    pass


def check_dtype(dtype: torch.dtype) -> None:
    if dtype in REFUSED_DTYPES or dtype.is_complex:
        raise UnsupportedDtype(
            f"xdna: dtype {dtype} is not supported on the NPU (it has no complex arithmetic). "
            f"Keep this tensor on the CPU, or split it into real and imaginary float32 tensors "
            f"(torch.view_as_real) before moving it to 'xdna'.")


def contiguous_strides(size) -> list[int]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(int(s), 1)
    return strides[::-1]


def storage_elems(size, stride, offset: int = 0) -> int:
    if any(int(s) == 0 for s in size):
        return offset
    return offset + 1 + sum((int(s) - 1) * int(st) for s, st in zip(size, stride))


class _Release(weakref.ref):
    """A weak reference to a buffer that releases its device memory when the buffer dies.
    (Lighter than weakref.finalize, which costs a registry entry and atexit bookkeeping on every
    allocation of the eager hot path.)"""

    __slots__ = ("dev", "buf_id", "nbytes", "handle")


_live_refs: set[_Release] = set()       # keeps the refs (and so their callbacks) alive


def _released(ref: _Release) -> None:
    _live_refs.discard(ref)
    ref.dev.release(ref.buf_id, ref.nbytes, ref.handle)


def attach(t: torch.Tensor, buf: Buffer) -> None:
    """Bind a buffer to a tensor's storage; the buffer is released when the storage dies."""
    t.untyped_storage()._xdna_buf = buf
    r = _Release(buf, _released)
    r.dev, r.buf_id, r.nbytes, r.handle = get_device(), buf.id, buf.nbytes, buf.handle
    _live_refs.add(r)


_set_storage = aten.set_.source_Storage_storage_offset.redispatch
_checked_dtypes: set[torch.dtype] = set()


def _new(size: list[int], stride: list[int], n: int, dtype: torch.dtype,
         offset: int) -> torch.Tensor:
    if dtype not in _checked_dtypes:
        check_dtype(dtype)
        _checked_dtypes.add(dtype)
    buf = get_device().alloc(n * dtype.itemsize)
    t = torch._C._acc.create_empty_tensor([n], dtype)
    attach(t, buf)
    # the TensorImpl's storage may report 0 bytes (data_ptr 0 keeps torch.load happy); the
    # logical size lives here
    t.untyped_storage()._xdna_nbytes = n * dtype.itemsize
    if offset or len(size) != 1 or size[0] != n or stride[0] != 1:
        _set_storage(META, t, t.untyped_storage(), offset, size, stride)
    return t


def new_tensor(size, stride, dtype: torch.dtype, offset: int = 0) -> torch.Tensor:
    """A fresh xdna tensor with its own buffer (uninitialized)."""
    size = [int(s) for s in size]
    stride = [int(s) for s in stride]
    return _new(size, stride, storage_elems(size, stride, offset), dtype, offset)


def empty_with_arg(size, dtype: torch.dtype) -> tuple[torch.Tensor, TensorArg]:
    """A fresh contiguous xdna tensor and its launch argument, built from the geometry just
    computed (strides and element count in one pass: the eager hot path)."""
    size = [int(s) for s in size]
    stride = [1] * len(size)
    acc = 1
    for i in range(len(size) - 1, -1, -1):
        stride[i] = acc
        acc *= size[i] if size[i] > 1 else 1
    n = acc if 0 not in size else 0
    t = _new(size, stride, n, dtype, 0)
    return t, TensorArg(t.untyped_storage()._xdna_buf, dtype, tuple(size), tuple(stride), 0)


def empty(size, dtype: torch.dtype | None = None) -> torch.Tensor:
    return empty_with_arg(size, dtype or torch.get_default_dtype())[0]


def storage_nbytes(st: torch.UntypedStorage) -> int:
    """Logical byte size of an xdna storage."""
    return getattr(st, "_xdna_nbytes", None) or st.nbytes()


def buffer_of(t: torch.Tensor) -> Buffer:
    try:
        return t.untyped_storage()._xdna_buf
    except AttributeError:
        raise RuntimeError(
            "xdna: this tensor has no device buffer (it was not created by torch-xdna); "
            "create it with device='xdna' or .to('xdna')") from None


def arg(t: torch.Tensor) -> TensorArg:
    """The launch argument for an xdna tensor (a strided view of its buffer)."""
    return TensorArg(buffer_of(t), t.dtype, tuple(t.shape), t.stride(), t.storage_offset())


def host_view(t: torch.Tensor, for_write: bool = False) -> torch.Tensor:
    """A CPU tensor aliasing the tensor's bytes (synced from the device first)."""
    buf = buffer_of(t)
    dev = get_device()
    dev.read(buf)
    if for_write:
        from torch_xdna.runtime import Coherence
        buf.state = Coherence.HOST_DIRTY
    return buf.view(t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset())


def alias(base: torch.Tensor, size, stride, offset: int) -> torch.Tensor:
    """A view of `base`'s storage with the given geometry (through the Meta kernel)."""
    return aten.as_strided.default.redispatch(META, base, list(size), list(stride), offset)
