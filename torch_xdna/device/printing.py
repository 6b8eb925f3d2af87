"""Printing xdna tensors: format a host copy (like CUDA does), keep the device suffix.

Printing would otherwise run ~20 ops on the device (abs, ne, masked_select, ...), each a launch
or a fallback; reading the tensor back once is what a user expects printing to cost.
"""
from __future__ import annotations

import torch
import torch._tensor_str as tensor_str

_orig_str = tensor_str._str


def _str(self: torch.Tensor, *, tensor_contents=None) -> str:
    if self.device.type != "xdna" or self.is_meta:
        return _orig_str(self, tensor_contents=tensor_contents)
    with torch.no_grad():
        host = self.detach().to("cpu")
    text = _orig_str(host, tensor_contents=tensor_contents)
    suffix = f", device='{self.device}'"
    if self.grad_fn is not None:
        suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
    elif self.requires_grad:
        suffix += ", requires_grad=True"
    return text[:-1] + suffix + ")" if text.endswith(")") else text


def install() -> None:
    tensor_str._str = _str
