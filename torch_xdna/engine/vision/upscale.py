"""Super-resolution on the NPU: a conv + pixel_shuffle network compiled with
torch.compile(backend="xdna") under strict() (no host nodes), run over fixed-size overlapping
tiles so any image fits the device's plan limits with one compiled shape.

Tiles overlap by the network's halo (the LR context an output pixel depends on); each tile
keeps only the pixels at least `halo` away from its inner edges, so the stitched result equals
the untiled network's (same per-pixel sums; no seams). Tiles that touch the image border keep
the border, where the network's own padding applies as it would untiled.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from torch_xdna.compiler.options import FallbackRefused
from torch_xdna.engine.counters import CounterDelta
from torch_xdna.engine.vision.image_embedder import allow_recompiles
from torch_xdna.models.sr import SubpixelBilinear, load_sr

DEFAULT_TILE = 96                 # LR pixels per tile side: a 64-feature 3x3 conv plan fits easily


def tile_windows(n: int, tile: int, halo: int) -> list[tuple[int, int, int]]:
    """(start, keep_from, keep_to) per window along one axis of length n; windows are
    min(tile, n) long, the last one shifted back to end at n."""
    t = min(tile, n)
    if t < n and t <= 2 * halo:
        raise ValueError(f"tile {tile} must exceed twice the network's halo ({halo}); "
                         f"use a tile of at least {2 * halo + 1}")
    out: list[tuple[int, int, int]] = []
    start, kept = 0, 0
    while kept < n:
        start = min(start, n - t)
        end = start + t
        keep_to = n if end == n else end - halo
        out.append((start, kept, keep_to))
        kept = keep_to
        start = keep_to - halo
    return out


@dataclass
class UpscaleStats:
    tiles: int = 0
    tile_shape: tuple[int, int] = (0, 0)
    dispatches: int = 0
    modeled_us: float = 0.0          # NPU time modeled by the simulator
    host_s: float = 0.0              # measured on this host
    shapes: set = field(default_factory=set)


class Upscaler:
    """A super-resolution network resident on the device, compiled once per tile shape."""

    def __init__(self, model: torch.nn.Module, cfg: dict | None = None, tile: int = DEFAULT_TILE,
                 cache_dir: str | Path | None = None):
        self.cfg = cfg or {}
        self.scale, self.channels = model.scale, model.channels
        self.halo, self.tile = int(model.halo), tile
        self.model = model.eval().to("xdna")
        opts = {"cache_dir": str(cache_dir)} if cache_dir else {}
        allow_recompiles()
        self.fn = torch.compile(self.model, backend="xdna", dynamic=False, options=opts)
        self.max_batch: dict[tuple[int, int], int] = {}    # tile shape -> images that plan

    @classmethod
    def load(cls, model_dir: str | Path | None = None, scale: int | None = None,
             channels: int = 3, **kw) -> "Upscaler":
        """From a model directory, or (no directory) the weight-free bilinear sub-pixel net."""
        if model_dir is None:
            if not scale:
                raise ValueError("give a model directory or a scale")
            return cls(SubpixelBilinear(scale, channels), {"architecture": "subpixel_bilinear",
                                                           "scale": scale}, **kw)
        model, cfg = load_sr(model_dir)
        if scale and scale != model.scale:
            raise ValueError(f"{model_dir} upscales x{model.scale}, not x{scale}; drop --scale "
                             f"or pick a x{scale} model")
        return cls(model, cfg, **kw)

    @property
    def name(self) -> str:
        return f"{self.cfg.get('architecture', type(self.model).__name__.lower())} x{self.scale}"

    def upscale_tensor(self, x: torch.Tensor, stats: UpscaleStats | None = None,
                       tile: int | None = None) -> torch.Tensor:
        """[N, C, H, W] float in [0, 1] (CPU) -> [N, C, H*s, W*s] (CPU), tile by tile; the N
        images (a video's frames) share each tile's forward, one dispatch per tile position."""
        from torch_xdna.runtime import get_device
        if x.dim() != 4 or x.shape[0] < 1 or x.shape[1] != self.channels:
            raise ValueError(f"expected an [N, {self.channels}, H, W] image tensor, got "
                             f"{list(x.shape)}")
        stats = stats if stats is not None else UpscaleStats()
        tile, s = tile or self.tile, self.scale
        n, c, h, w = x.shape
        out = torch.empty(n, c, h * s, w * s)
        dev = get_device()
        delta, t0 = CounterDelta(dev), time.perf_counter()
        with torch.no_grad(), torch.xdna.strict():
            for ys, ya, yb in tile_windows(h, tile, self.halo):
                th = min(tile, h)
                for xs, xa, xb in tile_windows(w, tile, self.halo):
                    tw = min(tile, w)
                    y = self._forward(x[:, :, ys:ys + th, xs:xs + tw].contiguous())
                    out[:, :, ya * s:yb * s, xa * s:xb * s] = \
                        y[:, :, (ya - ys) * s:(yb - ys) * s, (xa - xs) * s:(xb - xs) * s]
                    stats.tiles += 1
                    stats.tile_shape = (th, tw)
                    stats.shapes.add((th, tw))
        d = delta.take()
        stats.dispatches += d["dispatches"]
        stats.modeled_us += d["modeled_us"]
        stats.host_s += time.perf_counter() - t0
        return out

    def _forward(self, xt: torch.Tensor) -> torch.Tensor:
        """One tile position for N images. The conv plans' memory grows with N, so a batch that
        does not plan on the device (strict() refuses the host) runs in halves, and the size that
        fits is remembered per tile shape."""
        from torch._dynamo.exc import BackendCompilerFailed
        n, key = xt.shape[0], tuple(xt.shape[2:])
        cap = self.max_batch.get(key, n)
        if n > cap:
            return torch.cat([self._forward(part) for part in xt.split(cap)])
        try:
            return self.fn(xt.to("xdna")).cpu()
        except BackendCompilerFailed as e:
            if not isinstance(e.inner_exception, FallbackRefused):
                raise
            if n == 1:
                raise ValueError(f"{self.name}: a {key[0]}x{key[1]} tile does not plan on the "
                                 f"NPU (strict(): no host fallback); pick another --tile, e.g. "
                                 f"{DEFAULT_TILE} or 48") from None
        self.max_batch[key] = (n + 1) // 2
        return self._forward(xt)

    def upscale_image(self, img, stats: UpscaleStats | None = None, tile: int | None = None):
        """PIL image -> PIL image `scale` times larger. One-channel networks (ESPCN's Y channel)
        upscale luma and resize chroma bicubically; alpha is resized bicubically."""
        return self.upscale_images([img], stats, tile)[0]

    def upscale_images(self, imgs: list, stats: UpscaleStats | None = None,
                       tile: int | None = None) -> list:
        """PIL images of one size and mode -> PIL images `scale` times larger, all N through
        each tile's forward together (the video path's frame batches; upscale_image is N = 1)."""
        import numpy as np
        from PIL import Image
        first = imgs[0]
        if any(im.size != first.size or im.mode != first.mode for im in imgs):
            raise ValueError("a batch of images must share one size and mode")
        size = (first.width * self.scale, first.height * self.scale)
        if self.channels == 1:
            planes = [im.convert("YCbCr").split() for im in imgs]
            ys = self._run(np.stack([np.asarray(y) for y, _, _ in planes])[..., None], stats, tile)
            outs = [Image.merge("YCbCr", [Image.fromarray(yy[..., 0]),
                                          cb.resize(size, Image.BICUBIC),
                                          cr.resize(size, Image.BICUBIC)]).convert("RGB")
                    for yy, (_, cb, cr) in zip(ys, planes)]
        else:
            rgb = np.stack([np.asarray(im.convert("RGB")) for im in imgs])
            outs = [Image.fromarray(a) for a in self._run(rgb, stats, tile)]
        if first.mode in ("RGBA", "LA"):
            for out, im in zip(outs, imgs):
                out.putalpha(im.getchannel("A").resize(size, Image.BICUBIC))
        return outs

    def _run(self, arr, stats, tile):
        """uint8 [N, H, W, C] -> uint8 [N, H*s, W*s, C] through the network."""
        import numpy as np
        x = torch.from_numpy(np.array(arr, dtype=np.float32)).permute(0, 3, 1, 2) / 255.0
        y = self.upscale_tensor(x, stats, tile).permute(0, 2, 3, 1)
        return (y.clamp(0, 1) * 255.0).round().to(torch.uint8).numpy()
