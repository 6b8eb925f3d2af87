"""`torch.xdna`: the device module PyTorch finds for the 'xdna' device type."""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from torch_xdna.device import fallback
from torch_xdna.runtime import get_device

_current = 0


def _check_index(index: int) -> int:
    if isinstance(index, torch.device):
        index = 0 if index.index is None else index.index
    if isinstance(index, str):
        index = torch.device(index).index or 0
    if index not in (0, None, -1):
        raise RuntimeError(f"xdna: device index {index} does not exist; this machine has 1 NPU "
                           f"(device 0)")
    return 0


def is_available() -> bool:
    """True: the simulator is always available; `backend()` says which backend runs."""
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return 1


def current_device() -> int:
    return _current


def set_device(device) -> None:
    _check_index(device)


class device(contextlib.ContextDecorator):
    """Context manager selecting an xdna device (there is one: index 0)."""

    def __init__(self, index) -> None:
        self.index = _check_index(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def synchronize(device=None) -> None:
    get_device().synchronize()


def backend() -> str:
    """'sim' (simulated NPU) or 'xrt' (real NPU through pyxrt)."""
    return get_device().backend


def get_device_name(device=None) -> str:
    return get_device().properties()["name"]


class _Properties:
    def __init__(self, d: dict) -> None:
        self.__dict__.update(d)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items())
        return f"_XdnaDeviceProperties({inner})"


def get_device_properties(device=None) -> _Properties:
    return _Properties(get_device().properties())


def get_device_capability(device=None) -> tuple[int, int]:
    return (4, 0) if get_device().gen.arch == "aie2p" else (1, 0)


def memory_allocated(device=None) -> int:
    return get_device().counters.allocated_bytes


def max_memory_allocated(device=None) -> int:
    return get_device().counters.peak_allocated_bytes


def reset_peak_memory_stats(device=None) -> None:
    get_device().reset_peak()


def empty_cache() -> None:
    import gc
    gc.collect()


def mem_get_info(device=None) -> tuple[int, int]:
    dev = get_device()
    return dev.memory_budget - dev.counters.allocated_bytes, dev.memory_budget


def manual_seed(seed: int) -> None:
    from torch_xdna.device.core import RNG
    RNG.seed(seed)


manual_seed_all = manual_seed


def seed() -> None:
    manual_seed(torch.seed())


def initial_seed() -> int:
    from torch_xdna.device.core import RNG
    return RNG.gen.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    from torch_xdna.device.core import RNG
    return RNG.gen.get_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    from torch_xdna.device.core import RNG
    RNG.gen.set_state(state)


def counters() -> dict:
    """Runtime counters: launches, dispatches, bytes synced, modeled time (simulator)."""
    return get_device().counters.snapshot()


def reset_counters() -> None:
    get_device().reset_counters()


def fallback_report() -> dict[str, int]:
    """op -> number of host runs since start (or the last reset_fallback_report)."""
    return fallback.report()


def reset_fallback_report() -> None:
    fallback.reset()


strict = fallback.strict
fallback_policy = fallback.policy


def profiler(**kwargs: Any):
    """Context manager recording every launch; yields a Profile (per-design/per-op table with
    host fallbacks, Chrome/Perfetto trace export). Times are modeled on the simulator."""
    from torch_xdna.runtime.profiler import profile
    return profile(get_device(), **kwargs)


def _lazy_init() -> None:
    get_device()


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes `torch.autocast("xdna", dtype=...)` accepts: the array's operands are bf16; fp16
    is stored and widened like bf16."""
    return [torch.bfloat16, torch.float16]
