"""torch.compile(backend="xdna") of a Whisper-base-shaped model runs wholly on the (simulated) NPU
under strict mode: d_model 512, 8 heads, FFN 2048, 80 mel bins, 3,000 frames (random weights
from a transformers config; nothing is downloaded).

Whisper's front end is conv1d(80 -> 512, k=3) over 3,000 frames then conv1d(512 -> 512, k=3,
stride 2): one input band of either is the whole sequence and does not fit a mem tile, so the
compiler splits each conv along time (compiler/lower_conv.py `time_tiles`): 2 + 2 launches.
The halo and edge-padding arithmetic is checked on its own for strides, dilations, 'same'
padding and a residual epilogue.
Values against PyTorch on CPU with atol = rtol = 2e-2 x max(1, max|ref|) (bf16 operands, fp32
accumulation; tests/compile_fixtures.py). The default test uses 1
encoder layer for speed; the full whisper-base (6 + 6 layers, WhisperForConditionalGeneration)
is the slow-marked test (30-90 s measured on this shared 2-core host) and
`python benchmarks/bench_compile_models.py --only whisper_base`.
"""
from __future__ import annotations

import pytest
import torch

from torch_xdna.compiler import backend as B
from torch_xdna.compiler.lower_conv import time_tiles
from torch_xdna.device import fallback
from torch_xdna.kernels.ops.conv import ConvDesign
from torch_xdna.runtime import PlanError, get_device
from compile_fixtures import close, fresh_compile  # noqa: F401  (autouse fixture)

transformers = pytest.importorskip("transformers")
FRAMES = 3000


def base_config(layers: int):
    """whisper-base dimensions (openai/whisper-base config.json), `layers` per stack."""
    return transformers.WhisperConfig(
        d_model=512, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=8,
        decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, num_mel_bins=80,
        max_source_positions=FRAMES // 2, max_target_positions=448, vocab_size=51865)


def compiled_strict(m: torch.nn.Module, kw: dict, tmp_path) -> torch.Tensor:
    """Model and inputs on xdna, compiled and called inside torch.xdna.strict()."""
    md = m.to("xdna")
    kx = {k: v.to("xdna") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    fn = torch.compile(md, backend="xdna", dynamic=False, options={"cache_dir": str(tmp_path)})
    with torch.no_grad(), torch.xdna.strict():
        return fn(**kx)[0].cpu()


def test_whisper_front_end_convs_are_time_tiled():
    """Neither conv plans whole; each splits into equal output tiles whose input windows
    (halo included) cover the sequence, and only the edge tiles carry the zero padding."""
    gen = get_device().gen
    for c_in, stride in ((80, 1), (512, 2)):
        d = ConvDesign((1, c_in, FRAMES), (512, c_in, 3), (stride,), (1,), (1,), bias=True,
                       epilogue="gelu")
        with pytest.raises(PlanError, match="mem tile"):
            d.plan(gen)
        tiles = time_tiles(d, gen)
        assert tiles is not None and len(tiles) == 2
        assert [(o0, o1) for o0, o1, *_ in tiles] == [(0, FRAMES // stride // 2),
                                                       (FRAMES // stride // 2, FRAMES // stride)]
        assert tiles[0][2] == 0 and tiles[-1][3] == FRAMES
        assert tiles[0][4].pre_pad == (1, 0) and all(t.padding == (0,) for *_, t in tiles)


class LongConv(torch.nn.Module):
    """relu(conv1d(x) [+ x]) over 3,001 frames: too long for one band, so time-tiled."""

    def __init__(self, k: int, stride: int, padding, dilation: int, residual: bool):
        super().__init__()
        c_out = 80 if residual else 64
        self.conv = torch.nn.Conv1d(80, c_out, k, stride=stride, padding=padding,
                                    dilation=dilation)
        self.residual = residual

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y + x if self.residual else y)


@pytest.mark.filterwarnings("ignore:Using padding='same'")       # PyTorch's CPU reference
@pytest.mark.parametrize("k,stride,padding,dilation,residual", [
    (3, 2, 1, 1, False), (5, 3, 0, 2, False), (4, 1, "same", 1, False), (7, 1, 9, 3, True)])
def test_time_tiled_conv_halo_and_edge_padding_match_cpu(k, stride, padding, dilation, residual,
                                                          tmp_path):
    """Halo windows (stride, dilation), edge padding (symmetric, 'same' with an even kernel
    through pre_pad), the residual sliced like the output: equal to conv1d on CPU; a warm start
    from the compile cache rebuilds the same tiles (bit-identical output)."""
    torch.manual_seed(0)
    m = LongConv(k, stride, padding, dilation, residual).eval()
    x = torch.randn(2, 80, 3001)
    with torch.no_grad():
        ref = m(x)
    fn = torch.compile(m, backend="xdna", dynamic=False,
                       options={"cache_dir": str(tmp_path), "fallback": "error"})
    with torch.no_grad():
        out = fn(x)
    s = B.HISTORY[-1]
    assert s.nodes_host == 0 and s.dispatches == 1
    convs = {k_: v for k_, v in s.design_names.items() if k_.startswith("conv1d")}
    assert sum(convs.values()) >= 2, convs
    assert all(("+residual+relu" if residual else "+relu") in k_ for k_ in convs), convs
    close(out, ref)
    torch._dynamo.reset()                     # warm start: the tiles come back from the cache
    fn = torch.compile(m, backend="xdna", dynamic=False,
                       options={"cache_dir": str(tmp_path), "fallback": "error"})
    with torch.no_grad():
        again = fn(x)
    assert B.HISTORY[-1].cache == "hit" and B.HISTORY[-1].design_names == s.design_names
    torch.testing.assert_close(again, out, atol=0, rtol=0)


def test_whisper_base_encoder_compiles_with_no_host_node(tmp_path):
    torch.manual_seed(0)
    m = transformers.WhisperModel(base_config(1)).get_encoder().eval()
    kw = {"input_features": torch.randn(1, 80, FRAMES)}
    with torch.no_grad():
        ref = m(**kw).last_hidden_state
    out = compiled_strict(m, kw, tmp_path)
    s = B.HISTORY[-1]
    assert (s.nodes_host, s.partitions, s.dispatches) == (0, 1, 1), s.line("whisper")
    assert fallback.report() == {}
    convs = sum(v for k, v in s.design_names.items() if k.startswith("conv1d"))
    assert convs == 4                          # 2 time tiles per conv
    close(out, ref)


@pytest.mark.slow
def test_whisper_base_full_model_compiles_with_no_host_node(tmp_path):
    """The whole whisper-base shape: 6 encoder + 6 decoder layers, logits over 51,865 tokens."""
    torch.manual_seed(0)
    m = transformers.WhisperForConditionalGeneration(base_config(6)).eval()
    kw = {"input_features": torch.randn(1, 80, FRAMES), "use_cache": False,
          "decoder_input_ids": torch.tensor([[50258, 50259, 50359, 50363, 440, 1203]])}
    with torch.no_grad():
        ref = m(**kw).logits
    out = compiled_strict(m, kw, tmp_path)
    s = B.HISTORY[-1]
    assert (s.nodes_host, s.partitions, s.dispatches) == (0, 1, 1), s.line("whisper-base")
    assert s.nodes_npu > 200 and fallback.report() == {}
    close(out, ref)
