"""Shared by the torch.compile tests: a fresh Dynamo and fallback report around each test (use
`fresh_compile` as an autouse fixture by importing it), and the bf16 tolerance against PyTorch
on CPU (bf16 operands, fp32 accumulation): atol = rtol = 2e-2 x max(1, max|ref|)."""
from __future__ import annotations

import pytest
import torch

from torch_xdna.device import fallback


@pytest.fixture(autouse=True)
def fresh_compile():
    torch._dynamo.reset()
    fallback.reset()
    yield
    torch._dynamo.reset()


def close(out: torch.Tensor, ref: torch.Tensor) -> None:
    scale = max(1.0, ref.abs().max().item())
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2 * scale, rtol=2e-2)
