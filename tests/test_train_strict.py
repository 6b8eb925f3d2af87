"""An MLP trains on the NPU kernels alone: forward, backward and optimizer steps under
`torch.xdna.strict()` (no host fallback anywhere, the backward pass included: PyTorch runs it on
an autograd worker thread, which must obey the block), losses within bf16 tolerance of the CPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def _mlp(act: str) -> nn.Module:
    torch.manual_seed(0)
    acts = {"relu_gelu": (nn.ReLU(), nn.GELU()), "smooth": (nn.Tanh(), nn.SiLU())}[act]
    return nn.Sequential(nn.Linear(16, 32), acts[0], nn.LayerNorm(32), nn.Linear(32, 32),
                         acts[1], nn.Dropout(0.0), nn.Linear(32, 5))


def _optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def _train(device: str, opt_name: str, act: str, loss_name: str, steps: int = 4):
    model = _mlp(act).to(device).train()
    opt = _optimizer(opt_name, model.parameters())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 16, generator=g)
    y = torch.randint(0, 5, (12,), generator=g)
    target = torch.randn(12, 5, generator=g)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(x.to(device))
        loss = F.cross_entropy(out, y.to(device)) if loss_name == "ce" else \
            F.mse_loss(out, target.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("opt_name,act,loss_name", [
    ("sgd", "relu_gelu", "ce"), ("adam", "relu_gelu", "ce"), ("adamw", "smooth", "mse")])
def test_mlp_trains_under_strict(opt_name, act, loss_name):
    ref, ref_model = _train("cpu", opt_name, act, loss_name)
    torch.xdna.reset_fallback_report()
    with torch.xdna.strict():
        got, model = _train("xdna", opt_name, act, loss_name)
    assert torch.xdna.fallback_report() == {}
    assert got[-1] < got[0]                                   # it learns
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), atol=2e-2, rtol=2e-2)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), atol=3e-2, rtol=3e-2)


def test_strict_covers_the_backward_thread():
    """A backward op without a kernel is refused inside strict(), though autograd runs it on
    another thread."""
    x = (torch.rand(6) + 0.5).to("xdna").requires_grad_()
    with torch.xdna.fallback_policy("silent"):
        y = torch.lgamma(x)                                 # no NPU kernel: a host run
    with torch.xdna.strict(), pytest.raises(NotImplementedError,
                                            match="aten.digamma.* has no NPU kernel"):
        y.sum().backward()                                  # d lgamma = digamma, on the host
