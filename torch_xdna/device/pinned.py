"""Pinned host memory and the other PrivateUse1 hooks PyTorch consults from CPU-only code.

Once a PrivateUse1 backend is registered, PyTorch treats it as *the* accelerator: `pin_memory()`,
`DataLoader(pin_memory=True)` and `xdna_tensor.to("cpu", non_blocking=True)` ask the
accelerator's hooks for a pinned-memory allocator. The Python hook interface of torch 2.13
(`torch._C._acc.PrivateUse1Hooks`) can only answer `is_built`, `is_available` and
`has_primary_context`; the allocator hook is C++-only and raises NotImplementedError. So the ops
that reach it are served here at the dispatcher instead:

- `aten::_pin_memory` and `aten::is_pinned` for dense CPU tensors: pinning copies into fresh host
  memory that torch-xdna tracks as pinned (the NPU reads system DRAM, so "pinned" means host memory
  handed to the device runtime; on the simulator it is ordinary host memory, tracked);
- `aten::_to_copy` for xdna tensors: a non-blocking copy to the CPU runs as a blocking copy into
  pinned host memory (what CUDA returns), every other conversion is PyTorch's own kernel.

Plain CPU code pays nothing: these kernels run only when something asks to pin.
Not covered (needs the C++ hook): factories with `pin_memory=True` (`torch.empty(..., pin_memory=
True)`) still raise, as they do on a CPU-only PyTorch without this package.
"""
from __future__ import annotations

import weakref

import torch

aten = torch.ops.aten
_CEA = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
# storage base pointer -> weak reference to the pinned storage (liveness check: the pointer may be
# reused by the CPU allocator after the pinned storage dies)
_pinned: dict[int, weakref.ref] = {}


class XdnaHooks(torch._C._acc.PrivateUse1Hooks):
    """Answers the hooks the Python interface exposes. `has_primary_context` is True once the
    runtime device has been opened, so PyTorch never opens it on behalf of CPU-only code."""

    def is_available(self) -> bool:
        return True

    def is_built(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        import torch_xdna.runtime as rt
        return rt.device_opened()


HOOKS = XdnaHooks()        # kept alive here: the C++ side holds it for the life of the process


def _track(t: torch.Tensor) -> torch.Tensor:
    st = t.untyped_storage()
    ptr = st.data_ptr()
    if ptr:
        _pinned[ptr] = weakref.ref(st, lambda _r, p=ptr: _forget(p, _r))
    return t


def _forget(ptr: int, ref: weakref.ref) -> None:
    if _pinned.get(ptr) is ref:
        del _pinned[ptr]


def is_pinned_storage(t: torch.Tensor) -> bool:
    st = t.untyped_storage()
    r = _pinned.get(st.data_ptr())
    return r is not None and r() is st


def _check_pin_device(device) -> None:
    if device is not None and torch.device(device).type != "xdna":
        raise RuntimeError(f"pin_memory: device {device} is not the registered accelerator "
                           f"'xdna'; call pin_memory() without a device")


def is_pinned(self: torch.Tensor, device=None) -> bool:
    """CPU tensors: True when the storage was pinned by torch-xdna."""
    return bool(_pinned) and is_pinned_storage(self)


def pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
    """A pinned copy of a dense CPU tensor (same sizes and strides, as PyTorch's own kernel)."""
    _check_pin_device(device)
    res = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype)
    res.copy_(self)
    return _track(res)


def to_copy(self: torch.Tensor, *, dtype=None, layout=None, device=None, pin_memory=None,
            non_blocking=False, memory_format=None) -> torch.Tensor:
    """xdna tensors: PyTorch's `_to_copy`, except that a non-blocking copy to the CPU (which asks
    for a pinned destination) completes synchronously into pinned host memory."""
    to_cpu = device is not None and torch.device(device).type == "cpu"
    if non_blocking and to_cpu:
        res = aten._to_copy.default.redispatch(
            _CEA, self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
            non_blocking=False, memory_format=memory_format)
        return _track(res) if res.layout == torch.strided else res
    return aten._to_copy.default.redispatch(
        _CEA, self, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
        non_blocking=non_blocking, memory_format=memory_format)


def register(lib: torch.library.Library) -> None:
    # a PyTorch build with CUDA/ROCm pins through that accelerator's allocator: leave it alone
    if torch.version.cuda is None and torch.version.hip is None:
        lib.impl(aten._pin_memory.default, pin_memory, "CPU")
        lib.impl(aten.is_pinned.default, is_pinned, "CPU")
    lib.impl(aten._to_copy.default, to_copy, "PrivateUse1")
