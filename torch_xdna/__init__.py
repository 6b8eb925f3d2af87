"""torch-xdna: the `xdna` PyTorch device on the AMD XDNA2 NPU (simulated by default).

`import torch_xdna` (or PyTorch's backend autoload, which imports it on `import torch`) registers
the 'xdna' device and `torch.xdna`; `torch.compile(backend="xdna")` becomes available.
"""
from __future__ import annotations

__version__ = "0.1.0"


def _register() -> None:
    from torch_xdna.device import register
    register()
    try:
        from torch_xdna.compiler import backend as _compiler_backend  # noqa: F401  registers "xdna"
    except ImportError:
        pass


def _autoload() -> None:
    """Entry point for the `torch.backends` group (PyTorch calls it during `import torch`).

    A failure here must never break `import torch` for the user: it becomes a warning.
    """
    try:
        _register()
    except Exception as e:  # pragma: no cover - exercised only on broken installs
        import warnings
        warnings.warn(f"torch-xdna: the 'xdna' device could not be registered ({e!r}); "
                      f"run `xdna doctor`, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0", RuntimeWarning)


_register()
