"""Super-resolution (models/sr.py, engine/vision/upscale.py, `xdna upscale`): ESPCN and EDSR compiled to
the NPU under strict() with zero host nodes, within bf16 tolerance of the same module on CPU;
tiled == untiled (no seams); the weight-free bilinear sub-pixel net == F.interpolate; the CLI."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from torch_xdna.compiler import backend as B
from torch_xdna.device import fallback
from torch_xdna.engine.vision.upscale import Upscaler, UpscaleStats, tile_windows
from torch_xdna.models.hf import ModelDirError
from torch_xdna.models.sr import EDSR, ESPCN, load_sr, save_sr

PIL = pytest.importorskip("PIL")


def close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 tolerance as in test_compile_models.py: 2e-2 x max(1, |ref|)."""
    tol = 2e-2 * max(1.0, float(ref.abs().max()))
    torch.testing.assert_close(out, ref, atol=tol, rtol=2e-2)


@pytest.mark.parametrize("n,tile,halo", [(40, 16, 4), (16, 16, 4), (10, 16, 4), (97, 32, 5),
                                         (33, 11, 5)])
def test_tile_windows_cover_once_with_context(n, tile, halo):
    wins = tile_windows(n, tile, halo)
    kept = [i for _, a, b in wins for i in range(a, b)]
    assert kept == list(range(n))                      # every pixel kept exactly once, in order
    for s, a, b in wins:
        t = min(tile, n)
        assert 0 <= s and s + t <= n
        assert a == 0 or a - s >= halo                 # context on the left unless at the border
        assert b == n or s + t - b >= halo
    with pytest.raises(ValueError, match="twice the network's halo"):
        tile_windows(40, 8, 4)


@pytest.fixture(scope="module")
def espcn_dir(tmp_path_factory):
    torch.manual_seed(0)
    m = ESPCN(3, channels=1, features=(16, 8)).eval()
    return save_sr(m, {"architecture": "espcn", "scale": 3, "channels": 1, "features": [16, 8]},
                   tmp_path_factory.mktemp("espcn-x3")), m


def _strict_clean(s) -> None:
    assert (s.partitions, s.nodes_host, s.host_ops) == (1, 0, {}), s
    assert fallback.report() == {}


def test_espcn_on_device_strict_tiled_equals_untiled(espcn_dir, tmp_path):
    d, ref_model = espcn_dir
    model, cfg = load_sr(d)
    x = torch.rand(1, 1, 40, 36)
    with torch.no_grad():
        ref = ref_model(x)
    up = Upscaler(model, cfg, tile=16, cache_dir=tmp_path)
    st = UpscaleStats()
    tiled = up.upscale_tensor(x, st)
    _strict_clean(B.HISTORY[-1])
    assert st.tiles == len(tile_windows(40, 16, 4)) * len(tile_windows(36, 16, 4))
    assert st.shapes == {(16, 16)} and st.modeled_us > 0 and st.dispatches == st.tiles
    assert tiled.shape == (1, 1, 120, 108)
    close(tiled, ref)
    whole = up.upscale_tensor(x, tile=64)                # one tile: the untiled network
    _strict_clean(B.HISTORY[-1])
    close(whole, ref)
    # seams would show as errors along tile edges far above the per-pixel bf16 noise
    assert (tiled - whole).abs().max() <= 2 * (whole - ref).abs().max() + 1e-3


def test_edsr_on_device_strict(tmp_path):
    torch.manual_seed(1)
    m = EDSR(2, channels=3, features=8, blocks=2, res_scale=0.1).eval()
    d = save_sr(m, {"architecture": "edsr", "scale": 2, "channels": 3, "features": 8,
                    "blocks": 2, "res_scale": 0.1}, tmp_path / "edsr")
    up = Upscaler.load(d, tile=64, cache_dir=tmp_path)
    x = torch.rand(1, 3, 20, 24)
    out = up.upscale_tensor(x)
    _strict_clean(B.HISTORY[-1])
    with torch.no_grad():
        close(out, m(x))


def test_load_errors(tmp_path):
    with pytest.raises(ModelDirError, match="no config.json"):
        load_sr(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "srgan", "scale": 2}))
    with pytest.raises(ModelDirError, match="supported: espcn, edsr"):
        load_sr(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "espcn", "scale": 2}))
    with pytest.raises(ModelDirError, match="no model.safetensors"):
        load_sr(tmp_path)


def test_cli_scale_baseline_is_bilinear_and_model_dir(espcn_dir, tmp_path, capsys):
    """A PNG made here, x2 through the weight-free sub-pixel net == bilinear interpolation
    (8-bit rounding); and an RGBA PNG through the ESPCN directory (luma net + chroma/alpha)."""
    import numpy as np
    from PIL import Image
    from torch_xdna.cli.main import main
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, (30, 50, 3), dtype=np.uint8)
    src = tmp_path / "in.png"
    Image.fromarray(arr).save(src)
    assert main(["upscale", str(src), str(tmp_path / "out.png"), "--scale", "2", "--json",
                 "--tile", "24"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output_size"] == [100, 60] and summary["tiles"] == 2 * 3
    out = np.asarray(Image.open(tmp_path / "out.png")).astype(np.float32)
    x = torch.from_numpy(arr).permute(2, 0, 1)[None].float() / 255
    ref = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
    ref = (ref[0].permute(1, 2, 0) * 255).round().numpy()
    assert np.abs(out - ref).max() <= 2                   # bf16 operands: a count or two of 255
    rgba = tmp_path / "in_rgba.png"
    Image.fromarray(np.dstack([arr, np.full((30, 50), 200, np.uint8)])).save(rgba)
    assert main(["upscale", str(rgba), str(tmp_path / "big.png"), "--model", str(espcn_dir[0])]) == 0
    big = Image.open(tmp_path / "big.png")
    assert big.size == (150, 90) and big.mode == "RGBA"
    assert main(["upscale", str(src), str(tmp_path / "o.png")]) == 2
    assert main(["upscale", str(src), str(tmp_path / "o.png"), "--model", str(espcn_dir[0]),
                 "--scale", "2"]) == 2
    (tmp_path / "bad.png").write_bytes(b"not an image")
    assert main(["upscale", str(tmp_path / "bad.png"), str(tmp_path / "o.png"), "--scale", "2"]) == 2


@pytest.fixture(autouse=True)
def _fresh_fallback_counts():
    """fallback.report() is process-wide: start each test from zero (other files run host ops)."""
    fallback.reset()
    yield
