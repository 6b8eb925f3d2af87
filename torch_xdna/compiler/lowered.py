"""The lowered form of one NPU partition: slots (device buffers), strided refs over them, and
launch specs (design + bindings). Plain data: the compile cache stores it as JSON, and a warm
start rebuilds launches from it without partitioning, fusion or planning."""
from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass, field

import torch

from torch_xdna.kernels.base import Design


class Unlowerable(Exception):
    """A node no design can hold (after splitting). `node`: that node's name when known, so the
    backend re-partitions with it on the host (compiler/backend.py); else the partition runs on
    the host."""

    def __init__(self, message: str, node: str | None = None):
        super().__init__(message)
        self.node = node


def dname(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def contiguous(shape) -> tuple:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def is_non_overlapping_and_dense(t: torch.Tensor) -> bool:
    """True when the strides are a permutation of a contiguous layout (no gaps, no overlap)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    acc = 1
    for st, sz in dims:
        if st != acc:
            return False
        acc *= sz
    return True


def storage_numel(shape, strides, offset=0) -> int:
    if any(s == 0 for s in shape):
        return max(offset, 1)
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, strides))


@dataclass
class Slot:
    kind: str                 # input | const | temp | output
    dtype: str
    numel: int
    index: int = -1           # input position
    name: str = ""            # const attribute
    sources: list = field(default_factory=list)   # packed: input positions concatenated (dim 0)


@dataclass
class Ref:
    slot: int
    shape: tuple
    strides: tuple
    offset: int = 0


@dataclass
class LaunchSpec:
    design: Design
    inputs: list
    outputs: list
    op: str = ""


@dataclass
class Lowered:
    name: str
    slots: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    input_strides: list = field(default_factory=list)
    modeled_us: float = 0.0

    # -- JSON (the compile cache) ------------------------------------------------------------
    def to_json(self) -> dict:
        return {"name": self.name, "slots": [dataclasses.asdict(s) for s in self.slots],
                "launches": [{"design": encode_design(l.design),
                              "inputs": [_ref_json(r) for r in l.inputs],
                              "outputs": [_ref_json(r) for r in l.outputs], "op": l.op}
                             for l in self.launches],
                "outputs": [_ref_json(r) for r in self.outputs],
                "input_strides": [list(s) for s in self.input_strides],
                "modeled_us": self.modeled_us}

    @classmethod
    def from_json(cls, d: dict) -> "Lowered":
        return cls(name=d["name"], slots=[Slot(**s) for s in d["slots"]],
                   launches=[LaunchSpec(decode_design(l["design"]),
                                        [_ref_from(r) for r in l["inputs"]],
                                        [_ref_from(r) for r in l["outputs"]], l["op"])
                             for l in d["launches"]],
                   outputs=[_ref_from(r) for r in d["outputs"]],
                   input_strides=[tuple(s) for s in d["input_strides"]],
                   modeled_us=float(d["modeled_us"]))


def _ref_json(r: Ref) -> list:
    return [r.slot, list(r.shape), list(r.strides), r.offset]


def _ref_from(x: list) -> Ref:
    return Ref(int(x[0]), tuple(x[1]), tuple(x[2]), int(x[3]))


def _enc(v):
    if isinstance(v, Design):
        return {"design": encode_design(v)}
    if isinstance(v, torch.dtype):
        return {"dtype": dname(v)}
    if isinstance(v, (list, tuple)):
        return {"tuple": [_enc(x) for x in v]}
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    return v


def _dec(v):
    if isinstance(v, dict):
        if "design" in v:
            return decode_design(v["design"])
        if "dtype" in v:
            dt = getattr(torch, str(v["dtype"]), None)
            if not isinstance(dt, torch.dtype):
                raise ValueError(f"cached dtype {v['dtype']!r} is not a torch dtype")
            return dt
        if "tuple" in v:
            return tuple(_dec(x) for x in v["tuple"])
        if "float" in v:
            return float(v["float"])
    return v


DESIGN_PACKAGE = "torch_xdna.kernels"


def design_class(name: str) -> type:
    """The Design class a cache entry names, from the allowlist: a Design subclass defined at
    the top level of a module of the torch_xdna.kernels package. Anything else (another
    package, a function, a nested attribute path) is refused without importing it."""
    mod, sep, qual = str(name).partition(":")
    sub = mod.removeprefix(DESIGN_PACKAGE + ".")
    if (not sep or sub == mod or not all(s.isidentifier() for s in sub.split("."))
            or not qual.isidentifier() or sub not in _kernel_modules()):
        raise ValueError(f"cached design class {name!r} is not a torch_xdna design")
    cls = getattr(importlib.import_module(mod), qual, None)
    if not (isinstance(cls, type) and issubclass(cls, Design) and cls.__module__ == mod
            and dataclasses.is_dataclass(cls)):
        raise ValueError(f"cached design class {name!r} is not a torch_xdna design")
    return cls


def _kernel_modules() -> frozenset[str]:
    import pkgutil
    import torch_xdna.kernels as pkg
    prefix = DESIGN_PACKAGE + "."
    return frozenset(m.name.removeprefix(prefix)
                     for m in pkgutil.walk_packages(pkg.__path__, prefix) if not m.ispkg)


def encode_design(d: Design) -> dict:
    cls = type(d)
    return {"cls": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: _enc(getattr(d, f.name)) for f in dataclasses.fields(d)}}


def decode_design(d: dict) -> Design:
    cls = design_class(d["cls"])
    fields = d["fields"]
    if not isinstance(fields, dict):
        raise ValueError("cached design fields are not an object")
    return cls(**{str(k): _dec(v) for k, v in fields.items()})
