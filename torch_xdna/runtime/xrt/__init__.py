"""The `xrt` backend: the runtime's Device on a physical XDNA NPU through pyxrt.

`open_xrt_device(required)` is what `runtime.get_device()` calls. With TORCH_XDNA_BACKEND=auto it
returns None quickly and quietly when this machine cannot run the NPU path (no bound NPU, no
/dev/accel/accel0, no pyxrt, or no installed artifacts), so the simulator is used; with
TORCH_XDNA_BACKEND=xrt it raises BackendUnavailable naming what is missing.
"""
from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path

from torch_xdna.hw import host
from torch_xdna.runtime import settings
from torch_xdna.runtime.errors import BackendUnavailable

log = logging.getLogger("torch_xdna.xrt")

__all__ = ["open_xrt_device", "load_pyxrt", "emulated_selected"]

HINT = ("Run `xdna doctor` for the exact fix, or set TORCH_XDNA_BACKEND=sim (or unset it) to use "
        "the simulator.")


def emulated_selected() -> bool:
    """TORCH_XDNA_XRT=emulated: the xrt backend drives the emulated NPU (runtime/xrt/emulated)."""
    return settings.get("TORCH_XDNA_XRT") == "emulated"


def load_pyxrt(system=None):
    """(pyxrt module, None) or (None, why). Also looks in <XRT prefix>/python like setup.sh does.
    With TORCH_XDNA_XRT=emulated: the emulated NPU's module (never a hardware result)."""
    if emulated_selected():
        from torch_xdna.runtime.xrt import emulated
        return emulated, None
    try:
        return importlib.import_module("pyxrt"), None
    except ImportError as e:
        first = e
    if system is not None and system.is_real:
        tag = sys.implementation.cache_tag or ""
        for rel in host.XRT_PREFIXES.value:          # /opt/xilinx/xrt/python, then /usr's dist-packages
            for sub in host.XRT_PYTHON_DIRS:
                xrt_py = system.path(rel) / sub
                has_build = xrt_py.is_dir() and any(tag in p.name or p.name == "pyxrt.so"
                                                    for p in xrt_py.glob("pyxrt*.so"))
                if not has_build or str(xrt_py) in sys.path:
                    continue
                sys.path.append(str(xrt_py))       # appended: never shadows this environment
                try:
                    return importlib.import_module("pyxrt"), None
                except ImportError as e:
                    first = e
    return None, (f"pyxrt is not importable from {sys.executable} ({first}); it is built per Python "
                  f"version (source /opt/xilinx/xrt/setup.sh, or build XRT's Python binding for "
                  f"Python {sys.version_info.major}.{sys.version_info.minor})")


def open_xrt_device(required: bool, *, system=None, pyxrt=None, artifacts=None):
    """An XrtDevice, or None (auto, nothing usable), or BackendUnavailable (required)."""
    from torch_xdna.runtime.xrt.probe import HostSystem, quick_probe

    if pyxrt is None and emulated_selected():
        return _open_emulated(required, artifacts)
    system = system or HostSystem()
    npu, missing = quick_probe(system)
    xrt = pyxrt
    if xrt is None and (required or not missing):
        xrt, why = load_pyxrt(system)
        if xrt is None:
            missing.append(why)
    if npu is not None and npu.generation is None:
        missing.append(f"NPU {npu.address} ({npu.device_id} rev {npu.revision:#04x}) is not a known "
                       f"generation")
    from torch_xdna.runtime.xrt.artifacts import ArtifactStore
    store = artifacts if artifacts is not None else ArtifactStore()
    if not missing and not required and not store.has_any():
        log.info("xrt: NPU found but no artifacts in %s; using the simulator", store.directory)
        return None
    if missing:
        if not required:
            log.debug("xrt backend unavailable: %s", "; ".join(missing))
            return None
        raise BackendUnavailable("TORCH_XDNA_BACKEND=xrt but the NPU cannot be used: "
                                 + "; ".join(missing) + ". " + HINT)
    from torch_xdna.runtime.device import default_memory_budget
    from torch_xdna.runtime.xrt.device import XrtDevice
    try:
        return XrtDevice(npu.generation, default_memory_budget(npu.generation), xrt, store)
    except BackendUnavailable:
        if required:
            raise
        log.warning("xrt: the NPU could not be opened; using the simulator. %s", HINT)
        return None


def _open_emulated(required: bool, artifacts=None):
    """The xrt backend on the emulated NPU: no probe of this machine (there is no chip to find)."""
    from torch_xdna.hw import get_generation
    from torch_xdna.runtime.device import default_memory_budget
    from torch_xdna.runtime.xrt import emulated
    from torch_xdna.runtime.xrt.artifacts import ArtifactStore
    from torch_xdna.runtime.xrt.device import XrtDevice

    store = artifacts if artifacts is not None else ArtifactStore()
    if not required and not store.has_any():
        log.info("xrt (emulated): no artifacts in %s; using the simulator", store.directory)
        return None
    gen = get_generation(emulated.GENERATION)
    log.info("xrt: using the emulated NPU (%s); results are emulated, not hardware results", gen.name)
    return XrtDevice(gen, default_memory_budget(gen), emulated, store)
