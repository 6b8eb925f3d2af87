"""Selects, masked and index writes, and tensor-operand math on the vector unit (TableDesign ops):
tril/triu (a select against the element's row/column index), clamp with tensor bounds, pow with
a tensor exponent or a scalar base (exp2(e * log2 b): bf16 operands, fp32 math), scatter /
scatter_add (index writes through the DMA with an add on the accumulator for scatter_add).
"""
from __future__ import annotations

import torch

from torch_xdna.kernels.ops.table import define


def _tri(fn):
    return lambda xs, diagonal=0, **kw: fn(xs[0], diagonal)


def _clamp(xs, has_min, has_max, **kw):
    lo = xs[1] if has_min else None
    hi = xs[1 + has_min] if has_max else None
    return torch.clamp(xs[0], lo, hi)


def _pow(xs, base=None, **kw):
    if base is not None:
        return torch.pow(base, xs[0])
    return torch.pow(xs[0], xs[1])


def _scatter(xs, dim, value=None, reduce=None, **kw):
    self, index = xs[0], xs[1]
    src = value if value is not None else xs[2]
    if reduce is None:
        return torch.scatter(self, dim, index, src)
    return torch.scatter(self, dim, index, src, reduce=reduce)


define("tril", _tri(torch.tril), 1, numerics="exact")
define("triu", _tri(torch.triu), 1, numerics="exact")
define("clamp_tensor", _clamp, 2, numerics="exact")
define("pow_tensor", _pow, 9)
define("scatter", _scatter, 1, numerics="exact")
define("scatter_add", lambda xs, dim, **kw: torch.scatter_add(xs[0], dim, xs[1], xs[2]), 1,
       numerics="exact")
define("sign", lambda xs, **kw: torch.sign(xs[0]), 1, numerics="exact")
define("logit", lambda xs, eps=None, **kw: torch.logit(xs[0], eps), 6)
