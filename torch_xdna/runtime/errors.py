"""Errors raised by the runtime. Each names the thing and what to do."""
from __future__ import annotations


class XdnaError(RuntimeError):
    """Base class of torch-xdna runtime errors."""


class DeviceOutOfMemory(XdnaError, MemoryError):
    def __init__(self, requested: int, available: int, budget: int):
        self.requested, self.available, self.budget = requested, available, budget
        super().__init__(
            f"xdna: out of device memory: requested {requested} bytes, {available} bytes available "
            f"of a {budget}-byte budget. Free tensors (del + torch.xdna.empty_cache()), use smaller "
            f"batches, or raise TORCH_XDNA_MEMORY_BUDGET (bytes)."
        )


class BackendUnavailable(XdnaError):
    """The requested backend cannot be used on this machine."""


class LaunchError(XdnaError):
    """A launch failed (bad arguments, a run state other than COMPLETED, a timeout)."""
