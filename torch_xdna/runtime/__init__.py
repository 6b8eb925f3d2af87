"""The runtime: one Device interface, two backends (`sim`, `xrt`).

`get_device()` picks the backend once per process from TORCH_XDNA_BACKEND=auto|sim|xrt
(runtime/backends.py).
"""
from __future__ import annotations

from torch_xdna.runtime.backends import (BACKENDS, backend_name, device_opened, get_device,
                                         open_backend, set_device_for_testing)
from torch_xdna.runtime.buffer import Buffer, Coherence, TensorArg
from torch_xdna.runtime.device import Counters, Device, TraceRecord, default_memory_budget
from torch_xdna.runtime.errors import BackendUnavailable, DeviceOutOfMemory, LaunchError, XdnaError
from torch_xdna.runtime.launch import Launch, Program
from torch_xdna.runtime.plan import Plan, PlanError

__all__ = [
    "Buffer", "Coherence", "TensorArg", "Counters", "Device", "TraceRecord", "BackendUnavailable",
    "DeviceOutOfMemory", "LaunchError", "XdnaError", "Launch", "Program", "Plan", "PlanError",
    "get_device", "set_device_for_testing", "backend_name", "default_memory_budget",
    "open_backend", "device_opened", "BACKENDS",
]
