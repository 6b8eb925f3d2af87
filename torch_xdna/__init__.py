"""torch-xdna: the `xdna` PyTorch device on the AMD XDNA2 NPU (simulated by default)."""
from __future__ import annotations

__version__ = "0.1.0"
