"""A graph with a node the NPU cannot run never goes to the host whole: the NPU partitions form
around that node. Two ways a node ends up on the host:
- it has no NPU lowering at all (`bessel_j0`): the partitioner leaves it out;
- its lowering fails for its shapes (a conv1d dilated so far that even an 8-frame time tile's
  input band, 3,008 frames x 80 channels, does not fit a mem tile beside its weight panel; a
  softmax over 40,000-wide rows that fits no core's L1): the graph is partitioned again with
  that node alone on the host.
Values against PyTorch on CPU (bf16 operands, fp32 accumulation: atol = rtol = 2e-2 x
max(1, max|ref|), compile_fixtures.py).
Under strict mode (fallback 'error') such a graph is refused at compile time in one line.
"""
from __future__ import annotations

import pytest
import torch

from torch_xdna.compiler import backend as B
from torch_xdna.compiler.options import FallbackRefused
from torch_xdna.device import fallback
from compile_fixtures import close, fresh_compile  # noqa: F401  (autouse fixture)


class AroundConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        # dilation 1500: one output frame reads frames t-1500, t, t+1500, so every time tile
        # spans > 3,000 input frames and no tile plans (a k=3 conv without dilation is tiled)
        self.conv = torch.nn.Conv1d(80, 512, 3, padding=1500, dilation=1500)
        self.post = torch.nn.Linear(512, 64)

    def forward(self, x):
        h = torch.relu(x * 2.0 + 1.0)
        h = self.conv(h)
        return self.post(torch.nn.functional.gelu(h.transpose(1, 2)) + 1.0)


class AroundNoKernel(torch.nn.Module):
    """linear -> gelu -> bessel_j0 (no NPU kernel) -> linear -> + 1."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(32, 64)
        self.post = torch.nn.Linear(64, 16)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.pre(x))
        return self.post(torch.special.bessel_j0(h)) + 1.0


def run(m: torch.nn.Module, x: torch.Tensor, tmp_path):
    """(compiled output on the model and input on xdna, CPU eager reference, compile stats)."""
    with torch.no_grad():
        ref = m(x)
    fn = torch.compile(m.to("xdna"), backend="xdna", dynamic=False,
                       options={"cache_dir": str(tmp_path), "fallback": "silent"})
    with torch.no_grad():
        out = fn(x.to("xdna")).cpu()
    return out, ref, B.HISTORY[-1]


def test_unlowerable_node_runs_alone_on_the_host(tmp_path):
    torch.manual_seed(0)
    out, ref, s = run(AroundConv().eval(), torch.randn(1, 80, 3000), tmp_path)
    assert s.host_ops == {"aten.convolution": 1}, s.host_ops
    assert s.partitions == 2 and s.nodes_npu >= 5           # before and after the conv
    close(out, ref)


def test_chain_op_that_fits_no_plan_runs_alone_on_the_host(tmp_path):
    """The GEMMs around an oversized softmax stay on the NPU (the whole graph went to the host
    when the failed chain could not be blamed on one node)."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(64, 40000) * 0.1, torch.randn(40000, 16) * 0.01

    def f(x):
        return (torch.softmax((x @ w1) * 2.0, dim=-1) * 3.0) @ w2
    x = torch.randn(2, 64)
    fn = torch.compile(f, backend="xdna", dynamic=False,
                       options={"cache_dir": str(tmp_path), "fallback": "silent"})
    with torch.no_grad():
        out, ref = fn(x), f(x)
    s = B.HISTORY[-1]
    assert s.host_ops == {"aten._softmax": 1} and (s.partitions, s.nodes_npu) == (2, 4), s.host_ops
    torch.testing.assert_close(out, ref, atol=2e-2 * float(ref.abs().max()), rtol=2e-2)


def test_op_without_kernel_splits_the_graph_into_two_npu_partitions(tmp_path):
    torch.manual_seed(0)
    out, ref, s = run(AroundNoKernel().eval(), torch.randn(8, 32), tmp_path)
    assert s.host_ops == {"aten.special_bessel_j0": 1}, s.host_ops
    assert (s.partitions, s.nodes_host, s.dispatches) == (2, 1, 2)
    rep = fallback.report()                  # the host run is counted (the eager device's op)
    assert list(rep.values()) == [1] and "bessel_j0" in next(iter(rep)), rep
    close(out, ref)


def test_strict_refuses_a_host_node_at_compile_time_in_one_line(tmp_path):
    m = AroundNoKernel().eval().to("xdna")
    fn = torch.compile(m, backend="xdna", dynamic=False, options={"cache_dir": str(tmp_path)})
    with torch.no_grad(), torch.xdna.strict(), pytest.raises(Exception) as err:
        fn(torch.randn(8, 32).to("xdna"))
    e = err.value
    e = getattr(e, "inner_exception", e)     # Dynamo wraps backend errors (BackendCompilerFailed)
    assert isinstance(e, FallbackRefused), repr(err.value)
    msg = str(e)
    assert "\n" not in msg and "aten.special_bessel_j0" in msg and "'error'" in msg, msg
