"""torch.save / torch.load of xdna tensors.

Saving writes the bytes of the BO under the location tag 'xdna:0'; loading restores them into a
new buffer. Storages are handled at the Python level so torch never dereferences the empty
data pointer of an xdna storage (which would crash the process).
"""
from __future__ import annotations

import torch
import torch.serialization as ser

from torch_xdna.device import storage


def _tag(obj) -> str | None:
    if getattr(obj, "device", None) is not None and obj.device.type == "xdna":
        return "xdna:0"
    return None


def _restore(obj, location: str):
    if not location.startswith("xdna"):
        return None
    return to_xdna_storage(obj)


def to_xdna_storage(cpu_storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new xdna storage holding a copy of a CPU storage's bytes."""
    if isinstance(cpu_storage, torch.TypedStorage):
        cpu_storage = cpu_storage._untyped_storage
    if cpu_storage.device.type == "xdna":
        return cpu_storage
    n = cpu_storage.nbytes()
    t = storage.new_tensor([n], [1], torch.uint8)
    host = torch.empty(0, dtype=torch.uint8).set_(cpu_storage)
    storage.host_view(t, for_write=True).copy_(host)
    return t.untyped_storage()


def storage_to_cpu(st: torch.UntypedStorage) -> torch.UntypedStorage:
    buf = st._xdna_buf
    from torch_xdna.runtime import get_device
    get_device().read(buf)
    n = storage.storage_nbytes(st)
    return buf.host[:n].clone().untyped_storage()


_orig_cpu = torch.UntypedStorage.cpu


def _untyped_cpu(self):
    if self.device.type == "xdna":
        return storage_to_cpu(self)
    return _orig_cpu(self)


_orig_reduce = torch.Tensor._reduce_ex_internal


def _reduce_ex_internal(self, proto):
    """Pickle an xdna tensor as a CPU copy plus its device (views are saved as copies)."""
    if self.device.type == "xdna":
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))
    return _orig_reduce(self, proto)


def install() -> None:
    # priority 15: ahead of PyTorch's generic privateuse1 handler (23), which would crash
    ser.register_package(15, _tag, _restore)
    torch.UntypedStorage.cpu = _untyped_cpu
    torch.Tensor._reduce_ex_internal = _reduce_ex_internal
