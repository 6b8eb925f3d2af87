"""The runtime: one Device interface, two backends (`sim`, `xrt`).

`get_device()` picks the backend once per process from TORCH_XDNA_BACKEND=auto|sim|xrt.
"""
from __future__ import annotations

import os
import threading

from torch_xdna.hw import Generation, get_generation
from torch_xdna.runtime import settings
from torch_xdna.runtime.buffer import Buffer, Coherence, TensorArg
from torch_xdna.runtime.device import Counters, Device, TraceRecord
from torch_xdna.runtime.errors import BackendUnavailable, DeviceOutOfMemory, LaunchError, XdnaError
from torch_xdna.runtime.launch import Launch, Program
from torch_xdna.runtime.plan import Plan, PlanError

__all__ = [
    "Buffer", "Coherence", "TensorArg", "Counters", "Device", "TraceRecord", "BackendUnavailable",
    "DeviceOutOfMemory", "LaunchError", "XdnaError", "Launch", "Program", "Plan", "PlanError",
    "get_device", "set_device_for_testing", "backend_name", "default_memory_budget",
]

BACKENDS = settings.choices("TORCH_XDNA_BACKEND")
_device: Device | None = None
_lock = threading.Lock()


def backend_name() -> str:
    try:
        return settings.get("TORCH_XDNA_BACKEND")
    except settings.EnvError as e:
        raise BackendUnavailable(str(e)) from None


def default_memory_budget(gen: Generation) -> int:
    """NPU-reachable memory: TORCH_XDNA_MEMORY_BUDGET bytes, else the reachable share of RAM."""
    env = settings.get("TORCH_XDNA_MEMORY_BUDGET")
    if env is not None:
        return env
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16 << 30
    return int(total * gen.reachable_memory_fraction.value)


def _generation() -> Generation:
    return get_generation(settings.get("TORCH_XDNA_GENERATION"))


def _open(name: str) -> Device:
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
                _device = _open(backend_name())
    return _device


def set_device_for_testing(dev: Device | None) -> Device | None:
    """Swap the process-wide device (tests only); returns the previous one."""
    global _device
    prev, _device = _device, dev
    return prev
