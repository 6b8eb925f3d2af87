"""A node whose lowering fails for its shapes (here a conv1d whose input band does not fit a mem
tile beside its weight panel, as Whisper's first conv over 3,000 frames) goes to the host alone:
the graph is partitioned again around it, never sent to the host whole."""
from __future__ import annotations

import torch

from torch_xdna.compiler import backend as B


class AroundConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(80, 512, 3, padding=1)     # 80 x 3000: no mem-tile plan
        self.post = torch.nn.Linear(512, 64)

    def forward(self, x):
        h = torch.relu(x * 2.0 + 1.0)
        h = self.conv(h)
        return self.post(torch.nn.functional.gelu(h.transpose(1, 2)) + 1.0)


def test_unlowerable_node_runs_alone_on_the_host(tmp_path):
    torch.manual_seed(0)
    m = AroundConv().eval()
    x = torch.randn(1, 80, 3000)
    with torch.no_grad():
        ref = m(x)
    md = m.to("xdna")
    fn = torch.compile(md, backend="xdna", dynamic=False,
                       options={"cache_dir": str(tmp_path), "fallback": "silent"})
    with torch.no_grad():
        out = fn(x.to("xdna")).cpu()
    s = B.HISTORY[-1]
    assert s.host_ops == {"aten.convolution": 1}, s.host_ops
    assert s.partitions == 2 and s.nodes_npu >= 5           # before and after the conv
    torch.testing.assert_close(out, ref, atol=3e-2 * float(ref.abs().max()), rtol=3e-2)
