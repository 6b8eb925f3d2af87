"""Super-resolution networks (conv + pixel_shuffle) and their directory format.

A model directory holds `config.json` ({"architecture": "espcn"|"edsr"|"subpixel_bilinear",
"scale": N, "channels": 1|3, ...}) and `model.safetensors` with this module's parameter names.
ESPCN: Shi et al. 2016 (arXiv:1609.05158): 5x5 -> 3x3 -> 3x3 convs with tanh, then pixel_shuffle.
EDSR: Lim et al. 2017 (arXiv:1707.02921): residual blocks without batch-norm, scaled residuals,
a sub-pixel upsampler (x2 stages for 4, one stage for 2 and 3) and an RGB mean shift.
`subpixel_bilinear` has no weights: one fixed sub-pixel conv equal to bilinear interpolation
(align_corners=False), the `xdna upscale --scale N` baseline that needs no trained model.
Edges use replicate padding built from slices (so the whole network stays on the NPU).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_xdna.models.hf import ModelDirError

ARCHITECTURES = ("espcn", "edsr", "subpixel_bilinear")
DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)       # EDSR's MeanShift constants (DIV2K, range 1)


def replicate_pad(x: torch.Tensor, p: int) -> torch.Tensor:
    """Edge-replicate padding from slices and cat (no pad op needed on the device)."""
    if p == 0:
        return x
    x = torch.cat([x[:, :, :1].expand(-1, -1, p, -1), x, x[:, :, -1:].expand(-1, -1, p, -1)], 2)
    return torch.cat([x[..., :1].expand(-1, -1, -1, p), x, x[..., -1:].expand(-1, -1, -1, p)], 3)


class ESPCN(nn.Module):
    def __init__(self, scale: int, channels: int = 1, features: tuple[int, int] = (64, 32)):
        super().__init__()
        f1, f2 = features
        self.scale, self.channels = scale, channels
        self.conv1 = nn.Conv2d(channels, f1, 5)
        self.conv2 = nn.Conv2d(f1, f2, 3)
        self.conv3 = nn.Conv2d(f2, channels * scale * scale, 3)

    halo = 4                                   # LR pixels of context each output pixel needs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.conv1(replicate_pad(x, 2)))
        x = torch.tanh(self.conv2(replicate_pad(x, 1)))
        return F.pixel_shuffle(self.conv3(replicate_pad(x, 1)), self.scale)


class _ResBlock(nn.Module):
    def __init__(self, f: int, res_scale: float):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(f, f, 3, padding=1), nn.Conv2d(f, f, 3, padding=1)
        self.res_scale = res_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(x))) * self.res_scale


class EDSR(nn.Module):
    def __init__(self, scale: int, channels: int = 3, features: int = 64, blocks: int = 16,
                 res_scale: float = 1.0):
        super().__init__()
        if scale not in (2, 3, 4):
            raise ValueError(f"EDSR scale must be 2, 3 or 4 (got {scale})")
        self.scale, self.channels = scale, channels
        mean = DIV2K_RGB_MEAN if channels == 3 else (0.5,) * channels
        self.register_buffer("rgb_mean", torch.tensor(mean).view(1, channels, 1, 1))
        self.head = nn.Conv2d(channels, features, 3, padding=1)
        self.body = nn.Sequential(*[_ResBlock(features, res_scale) for _ in range(blocks)])
        self.body_tail = nn.Conv2d(features, features, 3, padding=1)
        stages = [2, 2] if scale == 4 else [scale]
        self.up = nn.ModuleList(nn.Conv2d(features, features * r * r, 3, padding=1) for r in stages)
        self.stages = stages
        self.tail = nn.Conv2d(features, channels, 3, padding=1)
        self.halo = 2 * blocks + 5     # head, blocks, body_tail, up convs, tail (HR convs rounded up)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x - self.rgb_mean)
        x = x + self.body_tail(self.body(x))
        for conv, r in zip(self.up, self.stages):
            x = F.pixel_shuffle(conv(x), r)
        return self.tail(x) + self.rgb_mean


class SubpixelBilinear(nn.Module):
    """Bilinear upscaling (align_corners=False) as one depthwise-free sub-pixel conv."""

    def __init__(self, scale: int, channels: int = 3):
        super().__init__()
        self.scale, self.channels = scale, channels
        w = torch.zeros(channels * scale * scale, channels, 3, 3)
        taps = []
        for i in range(scale):
            d = (i + 0.5) / scale - 0.5
            t = torch.zeros(3)
            if d >= 0:
                t[1], t[2] = 1 - d, d
            else:
                t[0], t[1] = -d, 1 + d
            taps.append(t)
        for c in range(channels):
            for i in range(scale):
                for j in range(scale):
                    w[c * scale * scale + i * scale + j, c] = torch.outer(taps[i], taps[j])
        self.conv = nn.Conv2d(channels, channels * scale * scale, 3, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(w)

    halo = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pixel_shuffle(self.conv(replicate_pad(x, 1)), self.scale)


def build(cfg: dict) -> nn.Module:
    arch = cfg.get("architecture")
    scale, ch = int(cfg.get("scale", 0)), int(cfg.get("channels", 3))
    if scale < 2:
        raise ModelDirError(f"config.json: 'scale' must be an integer >= 2 (got {cfg.get('scale')!r})")
    if arch == "espcn":
        return ESPCN(scale, ch, tuple(cfg.get("features", (64, 32))))
    if arch == "edsr":
        return EDSR(scale, ch, int(cfg.get("features", 64)), int(cfg.get("blocks", 16)),
                    float(cfg.get("res_scale", 1.0)))
    if arch == "subpixel_bilinear":
        return SubpixelBilinear(scale, ch)
    raise ModelDirError(f"config.json: architecture {arch!r} is not a super-resolution network "
                        f"this package defines (supported: {', '.join(ARCHITECTURES)})")


def load_sr(model_dir: str | Path) -> tuple[nn.Module, dict]:
    """(eval-mode module with the directory's weights, config) from a model directory."""
    from safetensors.torch import load_file
    d = Path(model_dir).expanduser()
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise ModelDirError(f"{d}: no config.json; a super-resolution directory needs config.json "
                            f"(architecture, scale) and model.safetensors")
    cfg = json.loads(cfg_path.read_text())
    model = build(cfg)
    wpath = d / "model.safetensors"
    if cfg["architecture"] != "subpixel_bilinear":
        if not wpath.is_file():
            raise ModelDirError(f"{d}: no model.safetensors")
        state = load_file(str(wpath))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if k != "rgb_mean"]
        if missing or unexpected:
            raise ModelDirError(f"{wpath}: weights do not match {cfg['architecture']} "
                                f"(missing: {missing[:4]}, unexpected: {unexpected[:4]})")
    return model.eval(), cfg


def save_sr(model: nn.Module, cfg: dict, model_dir: str | Path) -> Path:
    """Write a directory load_sr reads (tests and users converting their own weights)."""
    from safetensors.torch import save_file
    d = Path(model_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "rgb_mean"}
    save_file(state, str(d / "model.safetensors"))
    return d
