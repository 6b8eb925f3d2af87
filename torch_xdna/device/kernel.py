"""What every aten kernel on xdna tensors shares: the dtypes the array computes, design
interning, one launch on the tensors' buffers, device operands for Python scalars, fresh or
resized outputs, and the launch of a table-defined vector design (kernels/ops/table.py).

Kernels return None for dtypes their design does not take; the op table's guard (ops.py) then
applies the fallback policy.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from torch_xdna.device import storage
from torch_xdna.kernels.ops.table import TableDesign
from torch_xdna.runtime import Launch, get_device

COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.uint8,
                  torch.int16, torch.int32, torch.int64, torch.bool)
COMPUTE = frozenset(COMPUTE_DTYPES)
FLOAT_COMPUTE = (torch.float32, torch.bfloat16, torch.float16)

aten = torch.ops.aten
_scalar_cache: dict[tuple, torch.Tensor] = {}
_designs: dict[tuple, object] = {}


def design_for(cls, *args, **kwargs):
    """Intern designs: the same op on the same shapes reuses one instance (and its cached key),
    which keeps the eager hot path free of re-hashing and re-planning."""
    k = (cls, args, tuple(kwargs.items()))
    d = _designs.get(k)
    if d is None:
        d = _designs[k] = cls(*args, **kwargs)
    return d


def is_xdna(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "xdna"


def launch(design, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], op: str,
           **scalars) -> None:
    if not any(t.numel() for t in outputs):
        return                  # nothing to write (zero-size result): no launch, as on the CPU
    arg = storage.arg
    get_device().run(Launch(design, [arg(t) for t in inputs], [arg(t) for t in outputs], scalars,
                            op=op))


def scalar_tensor(value, dtype: torch.dtype) -> torch.Tensor:
    """A cached 0-dim xdna tensor holding a Python scalar (read-only, internal)."""
    # keyed by type and value: float() would merge distinct large ints, and NaN != NaN
    key = (type(value), value if value == value else "nan", dtype)
    t = _scalar_cache.get(key)
    if t is None:
        t = storage.empty([], dtype)
        storage.host_view(t, for_write=True).fill_(value)
        _scalar_cache[key] = t
    return t


def as_device_operand(x, dtype: torch.dtype) -> torch.Tensor:
    if is_xdna(x):
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            return scalar_tensor(x.item(), dtype)
        raise RuntimeError(f"xdna: expected all tensors on 'xdna', got a {x.device} tensor of shape "
                           f"{list(x.shape)}; move it with .to('xdna')")
    return scalar_tensor(x, dtype)


def supported_dtypes(tensors) -> bool:
    """True when every tensor among `tensors` has a dtype the array computes."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype not in COMPUTE:
            return False
    return True


def result_dtype(self: torch.Tensor, other) -> torch.dtype:
    """torch.result_type, with the common cases (same-dtype tensors; a float tensor and a Python
    number) answered without the call."""
    d = self.dtype
    if isinstance(other, torch.Tensor):
        if other.dtype is d:
            return d
    elif d.is_floating_point and isinstance(other, (int, float)):
        return d
    return torch.result_type(self, other)


def output_tensor(out: torch.Tensor | None, shape, dtype: torch.dtype) -> torch.Tensor:
    """A fresh output, or `out` resized to `shape` (structured .out calls pass 0-size outs)."""
    if out is None:
        return storage.empty(list(shape), dtype)
    if tuple(out.shape) != tuple(shape):
        out.resize_(list(shape))
    return out


def clamp_bounds(which: str, args, kw) -> tuple:
    """(lo, hi) of clamp / clamp_min / clamp_max from their positional or keyword arguments."""
    if which == "clamp":
        return (args[0] if args else kw.get("min")), (args[1] if len(args) > 1 else kw.get("max"))
    if which == "clamp_min":
        return (args[0] if args else kw["min"]), None
    return None, (args[0] if args else kw["max"])


def register_modes(reg: Callable, name: str, make: Callable[[str], Callable],
                   overload: str = "default") -> None:
    """Register aten `name`'s functional, out= and in-place (`name_`) variants of one overload
    through the op table's `reg`, with the kernel `make(mode)` builds for each mode."""
    packet = getattr(aten, name)
    reg(getattr(packet, overload), make("functional"))
    reg(getattr(packet, "out" if overload == "default" else overload + "_out"), make("out"))
    reg(getattr(getattr(aten, name + "_"), overload), make("inplace"))


# --- table-defined vector designs (kernels/ops/table.py) -----------------------------------------
def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, torch.dtype):
        return v
    return v


def run_table(op: str, inputs: Sequence[torch.Tensor], outs: Sequence, aten_name: str,
              design_cls=TableDesign, **params) -> list[torch.Tensor]:
    """Launch table op `op`; `outs` holds (shape, dtype) pairs or tensors to write."""
    tensors = [o if isinstance(o, torch.Tensor) else storage.empty(list(o[0]), o[1]) for o in outs]
    first = tensors[0]
    design = design_for(design_cls, op, tuple(tuple(t.shape) for t in inputs),
                        tuple(t.dtype for t in inputs), tuple(first.shape), first.dtype,
                        tuple(sorted((k, _freeze(v)) for k, v in params.items())),
                        tuple((tuple(t.shape), t.dtype) for t in tensors[1:]))
    launch(design, list(inputs), tensors, aten_name)
    return tensors


def operands_ok(*tensors, floats_only: bool = False) -> bool:
    """All tensors are xdna tensors of dtypes the vector unit takes."""
    for t in tensors:
        if t is None:
            continue
        if not is_xdna(t):
            return False
        if t.dtype not in COMPUTE or (floats_only and t.dtype not in FLOAT_COMPUTE):
            return False
    return True


def norm_dims(x: torch.Tensor, dim) -> tuple[int, ...] | None:
    """Sorted non-negative dims, or None for 'all dims'."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return None
    nd = max(x.dim(), 1)
    return tuple(sorted({int(d) % nd for d in dim}))


def reduced_shape(x: torch.Tensor, dims, keepdim: bool) -> list[int]:
    if dims is None or x.dim() == 0:
        return [1] * x.dim() if keepdim else []
    return [1 if i in dims else s for i, s in enumerate(x.shape)] if keepdim else \
        [s for i, s in enumerate(x.shape) if i not in dims]
