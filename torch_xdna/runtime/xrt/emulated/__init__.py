"""An emulated NPU behind the pyxrt API: `TORCH_XDNA_BACKEND=xrt TORCH_XDNA_XRT=emulated`.

This package stands where the `pyxrt` module stands (runtime/xrt.load_pyxrt returns it), so the
xrt backend runs unchanged: device, xclbin, hw_context, kernel, bo, run, the two enums. What it
replaces is the silicon and the vendor compiler, nothing else: an xclbin's MLIR-AIE module
configures the array (program.py), a run decodes the installed artifact's instruction stream and
executes it at the transaction level on the BOs' device memory (npu.py, memory.py), each core
kernel call running the C++ source the chip build compiles, built for the host
(kernels/aie/host_kernels.py). Results from here are emulated, never hardware results.

TORCH_XDNA_XRT_DEBUG=1 (strict mode) refuses a run whose BO was written on the host and not
synced, naming the argument; without it such a run computes on stale device memory, as the chip.
"""
from __future__ import annotations

from torch_xdna.runtime import settings
from torch_xdna.runtime.xrt.emulated import npu
from torch_xdna.runtime.xrt.emulated.memory import BufferObject as bo, xclBOSyncDirection
from torch_xdna.runtime.xrt.emulated.npu import GENERATION, ert_cmd_state, hw_context, kernel, run
from torch_xdna.runtime.xrt.emulated.xclbin import uuid, xclbin

EMULATED = True

__all__ = ["EMULATED", "GENERATION", "bo", "device", "ert_cmd_state", "hw_context", "kernel", "run",
           "uuid", "xclBOSyncDirection", "xclbin"]


def device(index: int = 0) -> npu.device:
    """pyxrt.device(index); strict when TORCH_XDNA_XRT_DEBUG is set."""
    return npu.device(index, strict=settings.get("TORCH_XDNA_XRT_DEBUG"))
