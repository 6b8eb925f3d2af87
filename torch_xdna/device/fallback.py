"""The one fallback policy for ops with no NPU kernel.

TORCH_XDNA_FALLBACK=warn (default: warn once per op, run on the host, count) | error (raise
NotImplementedError naming op, dtypes and shapes) | silent (run on the host, count).
`torch.xdna.strict()` switches to error mode for a block. Every host run is counted in
`fallback_report()` and shows in the profiler; it is never silent in the numbers.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter

import torch
from torch.utils._pytree import tree_map

from torch_xdna.device import storage
from torch_xdna.runtime import settings

MODES = settings.choices("TORCH_XDNA_FALLBACK")
_counts: Counter[str] = Counter()
_warned: set[str] = set()
_local = threading.local()


class XdnaFallbackWarning(UserWarning):
    pass


# the innermost policy() block of any thread: PyTorch runs the backward pass of device tensors on
# its own autograd worker thread, which must obey the block that called .backward()
_process_modes: list[str] = []


def mode() -> str:
    forced = getattr(_local, "mode", None) or (_process_modes[-1] if _process_modes else None)
    if forced:
        return forced
    return settings.get("TORCH_XDNA_FALLBACK")


@contextlib.contextmanager
def policy(new_mode: str):
    if new_mode not in MODES:
        raise ValueError(f"fallback mode {new_mode!r}: use one of {', '.join(MODES)}")
    prev = getattr(_local, "mode", None)
    _local.mode = new_mode
    _process_modes.append(new_mode)
    try:
        yield
    finally:
        _local.mode = prev
        _process_modes.reverse()
        _process_modes.remove(new_mode)          # this block's entry (the latest of its mode)
        _process_modes.reverse()


def strict():
    """Context manager: any op without an NPU kernel raises instead of running on the host."""
    return policy("error")


def report() -> dict[str, int]:
    return dict(_counts)


def reset() -> None:
    _counts.clear()
    _warned.clear()


def describe(args, kwargs) -> str:
    parts = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}@{a.device.type}")
        elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            parts.append("[" + ", ".join(f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
                                         for x in a if isinstance(x, torch.Tensor)) + "]")
    return ", ".join(parts)


def refuse(op_name: str, args, kwargs, why: str = "has no NPU kernel") -> None:
    raise NotImplementedError(
        f"xdna: {op_name} {why} (inputs: {describe(args, kwargs)}), and the fallback policy is "
        f"'error'. Move these tensors to the CPU for this op, or allow a counted host run with "
        f"TORCH_XDNA_FALLBACK=warn (outside torch.xdna.strict()).")


def note(op_name: str, args, kwargs, why: str = "has no NPU kernel") -> None:
    """Apply the policy to one host run of `op_name` (count, warn once, or refuse)."""
    m = mode()
    if m == "error":
        refuse(op_name, args, kwargs, why)
    _counts[op_name] += 1
    if m == "warn" and op_name not in _warned:
        _warned.add(op_name)
        warnings.warn(
            f"xdna: {op_name} {why}; running it on the host CPU (counted in "
            f"torch.xdna.fallback_report(); TORCH_XDNA_FALLBACK=error or torch.xdna.strict() "
            f"refuses instead). Warned once per op.", XdnaFallbackWarning, stacklevel=4)


def _is_xdna(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "xdna"


def run_on_host(op: torch._ops.OpOverload, args, kwargs):
    """Run `op` on host copies of its xdna arguments; write mutated arguments back; return
    results as xdna tensors (aliases stay aliases)."""
    schema = op._schema
    mutated: list[tuple[torch.Tensor, torch.Tensor]] = []
    xdna_in: dict[int, torch.Tensor] = {}

    def to_host(x):
        if _is_xdna(x):
            h = storage.host_view(x).clone()
            xdna_in[id(h)] = x
            return h
        return x

    h_args = [tree_map(to_host, a) for a in args]
    h_kwargs = {k: tree_map(to_host, v) for k, v in kwargs.items()}
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            h = h_args[i] if i < len(h_args) else h_kwargs.get(a.name)
            if isinstance(h, torch.Tensor) and id(h) in xdna_in:
                mutated.append((xdna_in[id(h)], h))
    out = op(*h_args, **h_kwargs)
    for dev_t, h in mutated:
        write_back(dev_t, h)
    by_host = {id(h): d for d, h in mutated}

    def to_dev(r):
        if isinstance(r, torch.Tensor) and r.device.type == "cpu":
            if id(r) in by_host:
                return by_host[id(r)]
            return from_host(r)
        return r
    return tree_map(to_dev, out)


def write_back(dev_t: torch.Tensor, h: torch.Tensor) -> None:
    """Copy a host result into an xdna tensor, resizing it first if the op resized `out`."""
    if tuple(dev_t.shape) != tuple(h.shape):
        dev_t.resize_(h.shape)
    if dev_t.dtype != h.dtype:
        h = h.to(dev_t.dtype)
    storage.host_view(dev_t, for_write=True).copy_(h)


def from_host(h: torch.Tensor) -> torch.Tensor:
    t = storage.new_tensor(h.shape, storage.contiguous_strides(h.shape), h.dtype)
    storage.host_view(t, for_write=True).copy_(h)
    return t
