"""Backend selection: `get_device()` opens the process-wide Device once, from
TORCH_XDNA_BACKEND=auto|sim|xrt (auto: the NPU through xrt when it and its artifacts are there,
else the simulator).

Its own module so that the runtime package (the interface) and the backends (sim/, xrt/) import
each other in one direction only: runtime/__init__ re-exports from here, this module opens the
backends.
"""
from __future__ import annotations

import threading

from torch_xdna.hw import Generation, get_generation
from torch_xdna.runtime.device import Device, default_memory_budget
from torch_xdna.runtime import settings
from torch_xdna.runtime.errors import BackendUnavailable

BACKENDS = settings.choices("TORCH_XDNA_BACKEND")
_device: Device | None = None
_lock = threading.Lock()


def backend_name() -> str:
    try:
        return settings.get("TORCH_XDNA_BACKEND")
    except settings.EnvError as e:
        raise BackendUnavailable(str(e)) from None


def _generation() -> Generation:
    return get_generation(settings.get("TORCH_XDNA_GENERATION"))


def open_backend(name: str) -> Device:
    """Open backend `name` (auto|sim|xrt) now, without caching it."""
    if name in ("auto", "xrt"):
        try:
            from torch_xdna.runtime.xrt import open_xrt_device
        except ImportError:
            open_xrt_device = None
        if open_xrt_device is not None:
            dev = open_xrt_device(required=(name == "xrt"))
            if dev is not None:
                return dev
        elif name == "xrt":
            raise BackendUnavailable(
                "TORCH_XDNA_BACKEND=xrt: the xrt backend is not available in this build; "
                "unset TORCH_XDNA_BACKEND (or set it to sim) to use the simulator")
    from torch_xdna.runtime.sim import SimDevice
    gen = _generation()
    return SimDevice(gen, default_memory_budget(gen))


def get_device() -> Device:
    """The process-wide device, opened once on first use."""
    global _device
    if _device is None:
        with _lock:
            if _device is None:
                _device = open_backend(backend_name())
    return _device


def device_opened() -> bool:
    """Whether the process-wide device is open (PyTorch's primary-context query; opening it on
    behalf of CPU-only code would be wrong)."""
    return _device is not None


def set_device_for_testing(dev: Device | None) -> Device | None:
    """Swap the process-wide device (tests only); returns the previous one."""
    global _device
    prev, _device = _device, dev
    return prev
