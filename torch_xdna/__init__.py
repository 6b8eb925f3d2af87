"""torch-xdna: the `xdna` PyTorch device on the AMD XDNA2 NPU (simulated by default).

`import torch_xdna` (or PyTorch's backend autoload, which imports it on `import torch`) registers
the 'xdna' device and `torch.xdna`; `torch.compile(backend="xdna")` becomes available.
"""
from __future__ import annotations

import sys

__version__ = "0.1.0"


def _register() -> None:
    from torch_xdna.device import register
    register()
    import importlib
    try:
        importlib.import_module("torch_xdna.compiler.backend")   # registers backend="xdna"
    except ModuleNotFoundError as e:
        if e.name != "torch_xdna.compiler.backend":
            raise


def _in_torch_autoload() -> bool:
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_import_device_backends":
            return True
        frame = frame.f_back
    return False


def _autoload() -> None:
    """Entry point for the `torch.backends` group (PyTorch calls it during `import torch`)."""


try:
    _register()
except Exception as _e:
    # A broken install must never break `import torch` for the user: warn instead.
    if not _in_torch_autoload():
        raise
    import warnings
    warnings.warn(f"torch-xdna: the 'xdna' device could not be registered ({_e!r}); run "
                  f"`xdna doctor`, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0", RuntimeWarning)
