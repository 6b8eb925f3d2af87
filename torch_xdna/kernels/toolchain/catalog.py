"""Designs by name, for the command line (`xdna kernels build --design NAME --shape ...`,
`xdna selftest`): each entry builds a Design and the operand specs of one example launch, which
is what an artifact's argument ABI is derived from.

Shapes are written as on the command line: "64x128x256" for a GEMM's M x K x N, "1024" or
"32x512" for elementwise and row ops.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from torch_xdna.kernels.base import Design
from torch_xdna.kernels.ops.gemm import GemmDesign
from torch_xdna.kernels.ops.vector import VectorDesign

Spec = tuple[tuple[int, ...], torch.dtype]        # (shape, dtype) of one launch operand


@dataclass(frozen=True)
class Example:
    """A design plus the operands of one launch of it (inputs then outputs)."""

    design: Design
    inputs: tuple[Spec, ...]
    outputs: tuple[Spec, ...]
    scalars: tuple[tuple[str, object], ...] = ()

    def tensors(self, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Deterministic host operands (integers small, floats normal) and zeroed outputs."""
        g = torch.Generator().manual_seed(seed)
        ins = []
        for shape, dt in self.inputs:
            if dt.is_floating_point:
                ins.append(torch.randn(shape, generator=g).to(dt))
            elif shape == ():
                ins.append(torch.ones((), dtype=dt))
            else:
                ins.append(torch.randint(-1000, 1000, shape, generator=g, dtype=dt))
        return ins, [torch.zeros(shape, dtype=dt) for shape, dt in self.outputs]


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(t) for t in str(text).lower().replace(",", "x").split("x") if t)
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise ValueError(f"--shape {text!r}: expected positive sizes like 64x128x256")
    return dims


def _dtype(name: str) -> torch.dtype:
    dt = {"float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "int32": torch.int32,
          "int8": torch.int8}.get(name)
    if dt is None:
        raise ValueError(f"--dtype {name!r}: use float32, bfloat16, int32 or int8")
    return dt


def _gemm(shape, dtype, bias: bool = False) -> Example:
    if len(shape) != 3:
        raise ValueError(f"gemm needs --shape MxKxN, got {'x'.join(map(str, shape))}")
    m, k, n = shape
    operands = "int8" if dtype == torch.int8 else "bf16"
    out = torch.int32 if dtype == torch.int8 else torch.float32
    d = GemmDesign(m, k, n, dtype=operands, out_dtype=out, bias=bias)
    ins: tuple[Spec, ...] = (((m, k), dtype), ((k, n), dtype))
    if bias:
        ins += (((n,), out),)
    return Example(d, ins, (((m, n), out),))


def _elementwise(op: str) -> Callable:
    def build(shape, dtype, **_) -> Example:
        d = VectorDesign(op, (shape,), (dtype,), shape, dtype)
        return Example(d, ((shape, dtype),), ((shape, dtype),))
    return build


def _add_one(shape, dtype, **_) -> Example:
    """x + 1 on int32: exact on any backend, so the simplest bit-exact hardware check."""
    dtype = torch.int32 if dtype in (torch.float32,) else dtype
    d = VectorDesign("add", (shape, ()), (dtype, dtype), shape, dtype)
    return Example(d, ((shape, dtype), ((), dtype)), ((shape, dtype),))


def _softmax(shape, dtype, **_) -> Example:
    d = VectorDesign("softmax", (shape,), (dtype,), shape, dtype, params=(("dim", len(shape) - 1),))
    return Example(d, ((shape, dtype),), ((shape, dtype),))


# name -> (builder, default dtype, one-line help)
DESIGNS: dict[str, tuple[Callable, str, str]] = {
    "gemm": (_gemm, "float32", "C = A @ B, --shape MxKxN (bf16 operands, fp32 accumulation; int8 -> int32)"),
    "gemm_bias": (lambda s, d: _gemm(s, d, bias=True), "float32", "C = A @ B + bias, --shape MxKxN"),
    "add_one": (_add_one, "int32", "y = x + 1 on int32, --shape N (the selftest's exact check)"),
    "relu": (_elementwise("relu"), "float32", "elementwise relu, --shape N or RxC"),
    "gelu": (_elementwise("gelu"), "float32", "elementwise gelu (erf), --shape N or RxC"),
    "silu": (_elementwise("silu"), "float32", "elementwise silu, --shape N or RxC"),
    "softmax": (_softmax, "float32", "softmax over the last dim, --shape RxC"),
}


def example(name: str, shape: str | tuple[int, ...], dtype: str | None = None) -> Example:
    """The named design at `shape` (a string like "64x128x256" or a tuple)."""
    entry = DESIGNS.get(name)
    if entry is None:
        raise ValueError(f"unknown design {name!r}; known: {', '.join(DESIGNS)}")
    build, default, _ = entry
    dims = parse_shape(shape) if isinstance(shape, str) else tuple(shape)
    return build(dims, _dtype(dtype or default))


def example_for(design: Design) -> Example | None:
    """An example launch for a design the engine or compiler made, where its operands follow
    from its parameters alone (GEMMs and single vector ops); None otherwise."""
    if isinstance(design, GemmDesign) and design.batch == 1 and not design.w_group and not design.residual:
        dt = torch.int8 if design.dtype == "int8" else torch.float32
        ins: tuple[Spec, ...] = (((design.m, design.k), dt), ((design.k, design.n), dt))
        if design.bias:
            ins += (((design.n,), design.out_dtype),)
        return Example(design, ins, (((design.m, design.n), design.out_dtype),))
    if isinstance(design, VectorDesign):
        return Example(design, tuple(zip((tuple(s) for s in design.in_shapes), design.in_dtypes)),
                       ((tuple(design.out_shape), design.out_dtype),))
    return None
