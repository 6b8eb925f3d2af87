"""Core kernels every device needs: allocation, views, copies, resize, fill, RNG, scalars.

These move bytes between the host and BOs (or alias them); they are transfers and host-side
initialisation, not NPU compute, so they are neither launches nor fallbacks.
"""
from __future__ import annotations

import torch

from torch_xdna.device import storage
from torch_xdna.kernels import VectorDesign
from torch_xdna.runtime import Launch, get_device

aten = torch.ops.aten
META = storage.META


class _Rng:
    """The xdna generator: host-side RNG whose state `torch.xdna.manual_seed` controls."""

    def __init__(self) -> None:
        self.gen = torch.Generator()
        self.gen.manual_seed(torch.initial_seed())

    def seed(self, s: int) -> None:
        self.gen.manual_seed(int(s))


RNG = _Rng()


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return storage.new_tensor(size, stride, dtype or torch.get_default_dtype())


def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None):
    return storage.empty(size, dtype or torch.get_default_dtype())


def _meta_view(op):
    return lambda *args, **kwargs: op.redispatch(META, *args, **kwargs)


def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """Any copy with an xdna side: host<->BO transfers, or a device copy/convert launch."""
    s_x, d_x = src.device.type == "xdna", dst.device.type == "xdna"
    if s_x and d_x:
        if src.numel():
            src_b = src.expand(dst.shape) if tuple(src.shape) != tuple(dst.shape) else src
            design = VectorDesign("copy", (tuple(src.shape),), (src.dtype,), tuple(dst.shape),
                                  dst.dtype)
            get_device().run(Launch(design, [storage.arg(src_b)], [storage.arg(dst)],
                                    op="aten.copy_"))
        return dst
    if d_x:      # host -> device
        if dst.numel():
            storage.host_view(dst, for_write=True).copy_(src.expand(dst.shape))
        return dst
    # device -> host
    if src.numel():
        dst.copy_(storage.host_view(src).expand(dst.shape))
    return dst


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        dst.resize_(src.shape)
    return copy_from(src, dst)


def resize_(self: torch.Tensor, size, memory_format=None) -> torch.Tensor:
    size = [int(s) for s in size]
    stride = storage.contiguous_strides(size)
    need = storage.storage_elems(size, stride, self.storage_offset()) * self.dtype.itemsize
    old = storage.buffer_of(self)
    if need > storage.storage_nbytes(self.untyped_storage()):
        fresh = storage.new_tensor([storage.storage_elems(size, stride, self.storage_offset())],
                                   [1], self.dtype)
        keep = min(old.nbytes, fresh.untyped_storage()._xdna_buf.nbytes)
        dev = get_device()
        dev.read(old)
        new_buf = storage.buffer_of(fresh)
        new_buf.host[:keep].copy_(old.host[:keep])
        from torch_xdna.runtime import Coherence
        new_buf.state = Coherence.HOST_DIRTY
        aten.set_.source_Storage_storage_offset.redispatch(
            META, self, fresh.untyped_storage(), self.storage_offset(), size, stride)
    else:
        aten.set_.source_Storage_storage_offset.redispatch(
            META, self, self.untyped_storage(), self.storage_offset(), size, stride)
    return self


def set_source_storage(self, source, storage_offset=0, size=(), stride=()):
    return aten.set_.source_Storage_storage_offset.redispatch(META, self, source, storage_offset,
                                                              size, stride)


def set_source_tensor(self, source):
    return aten.set_.source_Storage_storage_offset.redispatch(
        META, self, source.untyped_storage(), source.storage_offset(), source.shape,
        source.stride())


def local_scalar_dense(self: torch.Tensor):
    return storage.host_view(self).item()


def fill_(self: torch.Tensor, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.device.type != "xdna" else local_scalar_dense(value)
    if self.numel():
        storage.host_view(self, for_write=True).fill_(value)
    return self


def zero_(self: torch.Tensor) -> torch.Tensor:
    return fill_(self, 0)


def normal_(self, mean=0.0, std=1.0, *, generator=None):
    if self.numel():
        h = torch.empty(self.shape, dtype=self.dtype).normal_(mean, std, generator=generator or RNG.gen)
        storage.host_view(self, for_write=True).copy_(h)
    return self


def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    if self.numel():
        h = torch.empty(self.shape, dtype=self.dtype).uniform_(from_, to, generator=generator or RNG.gen)
        storage.host_view(self, for_write=True).copy_(h)
    return self


def random_from(self, from_, to=None, *, generator=None):
    if self.numel():
        h = torch.empty(self.shape, dtype=self.dtype).random_(from_, to, generator=generator or RNG.gen)
        storage.host_view(self, for_write=True).copy_(h)
    return self


def arange_out(start, end, step=1, *, out):
    h = torch.arange(start, end, step, dtype=out.dtype)
    if tuple(out.shape) != tuple(h.shape):
        out.resize_(h.shape)
    if h.numel():
        storage.host_view(out, for_write=True).copy_(h)
    return out


def fused_sdp_choice(*args, **kwargs) -> int:
    """Pick the math attention path (matmul + softmax), which lands on the NPU kernels."""
    return int(torch.nn.attention.SDPBackend.MATH)


def register(lib: torch.library.Library) -> None:
    P = "PrivateUse1"
    lib.impl(aten.empty_strided.default, empty_strided, P)
    lib.impl(aten.empty.memory_format, empty_memory_format, P)
    for op in (aten.view.default, aten.as_strided.default, aten._reshape_alias.default,
               aten.unfold.default, aten.view.dtype if False else aten.alias.default):
        lib.impl(op, _meta_view(op), P)
    lib.impl(aten._copy_from.default, copy_from, P)
    lib.impl(aten._copy_from_and_resize.default, copy_from_and_resize, P)
    lib.impl(aten.resize_.default, resize_, P)
    lib.impl(aten.set_.source_Storage_storage_offset, set_source_storage, P)
    lib.impl(aten.set_.source_Tensor, set_source_tensor, P)
    lib.impl(aten._local_scalar_dense.default, local_scalar_dense, P)
    lib.impl(aten.fill_.Scalar, fill_, P)
    lib.impl(aten.fill_.Tensor, fill_, P)
    lib.impl(aten.zero_.default, zero_, P)
    lib.impl(aten.normal_.default, normal_, P)
    lib.impl(aten.uniform_.default, uniform_, P)
    lib.impl(getattr(aten.random_, "from"), random_from, P)
    lib.impl(aten.arange.start_out, arange_out, P)
    lib.impl(aten._fused_sdp_choice.default, fused_sdp_choice, P)
