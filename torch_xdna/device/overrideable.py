"""`*_overrideable` ops: where composite ATen ops land for PrivateUse1 when no kernel exists.

PyTorch routes convolution on an out-of-tree device to `aten::convolution_overrideable` (and its
backward to `convolution_backward_overrideable`). Those have a CompositeExplicitAutograd kernel
that raises "convolution_overrideable not implemented", so the boxed fallback never sees them and
no fallback policy applies. Until an NPU kernel claims them (device/ops_conv.py, which wins when
it registers the same op), they run here as counted fallbacks of the op the user called:
`aten.convolution` / `aten.convolution_backward` on the host, under the policy (warn/error/silent).
"""
from __future__ import annotations

import torch

from torch_xdna.device import fallback

aten = torch.ops.aten


def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    args = (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    fallback.note("aten.convolution", args, {})
    return fallback.run_on_host(aten.convolution.default, args, {})


def convolution_out(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                    groups, *, out):
    res = convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                      groups)
    fallback.write_back(out, fallback.storage.host_view(res))
    return out


def convolution_backward(grad_output, input, weight, stride, padding, dilation, transposed,
                         output_padding, groups, output_mask):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    args = (grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
            output_padding, groups, output_mask)
    fallback.note("aten.convolution_backward", args, {})
    return fallback.run_on_host(aten.convolution_backward.default, args, {})


OVERRIDEABLE = {
    "aten.convolution_overrideable": (aten.convolution_overrideable.default, convolution),
    "aten.convolution_overrideable.out": (aten.convolution_overrideable.out, convolution_out),
    "aten.convolution_backward_overrideable": (aten.convolution_backward_overrideable.default,
                                               convolution_backward),
}


def register(lib: torch.library.Library, covered: list[str]) -> None:
    """Route each overrideable op that no NPU kernel module claimed to the fallback policy."""
    for name, (op, fn) in OVERRIDEABLE.items():
        if name not in covered:
            lib.impl(op, fn, "PrivateUse1")


def _refuse_sparse(op, *args, **kwargs):
    raise NotImplementedError(
        f"xdna: sparse tensors are not supported on the NPU ({op._schema.name} was called with "
        f"a sparse xdna tensor). Keep sparse tensors on the CPU, or call .to_dense() before "
        f"moving them to 'xdna'.")


def register_sparse(lib: torch.library.Library) -> None:
    """Sparse layouts on the device: a clear refusal instead of PyTorch's raw 'Could not run
    ... with arguments from the Sparsexdna backend'."""
    for key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        lib.fallback(_refuse_sparse, key)
    # torch.autocast("xdna"): no op has an autocast rule for this device, so every op falls
    # through and keeps its dtypes (the array takes bf16 operands whatever the dtype)
    lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
