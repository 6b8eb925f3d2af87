"""Image models from Hugging Face directories: which ones embed images, and their preprocessing.

Preprocessing is our own host code with Pillow + numpy, following the directory's
preprocessor_config.json the way transformers' PIL backend does (transformers 5.x,
image_processing_backends.PilBackend and image_transforms.py: convert to RGB, PIL resize to
`size` (height/width or shortest_edge, long edge = int(short * long / short)), center crop with
top = (H - h) // 2 (zero padding when the image is smaller), rescale in float64 then float32,
normalize (x - mean) / std), so a served model sees the pixel values transformers would give it.
"""
from __future__ import annotations

import base64
import binascii
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torch_xdna.models.hf import ModelDirError, read_config

IMAGE_TYPES = ("vit", "dinov2", "resnet")     # model_type values served as image embedders
IMAGENET_MEAN = (0.485, 0.456, 0.406)         # transformers' IMAGENET_DEFAULT_MEAN / STD
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_PIXELS = 64_000_000                 # refuse decompression bombs (Pillow warns at 89M)


def is_image_model(model_dir: str | Path) -> bool:
    return read_config(Path(model_dir)).get("model_type") in IMAGE_TYPES


@dataclass(frozen=True)
class ImagePreprocessor:
    """The fields of preprocessor_config.json that ViT/DINOv2/ResNet processors use."""

    size: dict
    resample: int = 2                     # PIL.Image.BILINEAR (ViT); DINOv2 dirs say 3 (BICUBIC)
    do_resize: bool = True
    do_center_crop: bool = False
    crop_size: dict | None = None
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    do_convert_rgb: bool = True

    @classmethod
    def from_dir(cls, model_dir: str | Path, model_type: str, image_size: int) -> "ImagePreprocessor":
        import json
        p = Path(model_dir) / "preprocessor_config.json"
        if not p.is_file():                   # the processor defaults of the model family
            if model_type == "resnet":        # microsoft/resnet-50's ConvNextImageProcessor
                return cls.convnext({"shortest_edge": 224}, 0.875, 3, IMAGENET_MEAN, IMAGENET_STD)
            if model_type == "dinov2":
                return cls(size={"shortest_edge": 256}, resample=3, do_center_crop=True,
                           crop_size={"height": image_size, "width": image_size},
                           image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
            return cls(size={"height": image_size, "width": image_size})
        try:
            c = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ModelDirError(f"{p}: invalid JSON ({e.msg}, line {e.lineno})") from None
        size = c.get("size", {"height": image_size, "width": image_size})
        if isinstance(size, int):
            size = {"height": size, "width": size}
        if c.get("crop_pct") is not None or "ConvNext" in str(c.get("image_processor_type", "")):
            return cls.convnext(size, float(c.get("crop_pct") or 224 / 256),
                                int(c.get("resample", 3)),
                                tuple(c.get("image_mean", (0.5, 0.5, 0.5))),
                                tuple(c.get("image_std", (0.5, 0.5, 0.5))),
                                rescale_factor=float(c.get("rescale_factor", 1 / 255)),
                                do_normalize=bool(c.get("do_normalize", True)))
        crop = c.get("crop_size")
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        return cls(size=size, resample=int(c.get("resample", 2)),
                   do_resize=bool(c.get("do_resize", True)),
                   do_center_crop=bool(c.get("do_center_crop", False)), crop_size=crop,
                   do_rescale=bool(c.get("do_rescale", True)),
                   rescale_factor=float(c.get("rescale_factor", 1 / 255)),
                   do_normalize=bool(c.get("do_normalize", True)),
                   image_mean=tuple(c.get("image_mean", (0.5, 0.5, 0.5))),
                   image_std=tuple(c.get("image_std", (0.5, 0.5, 0.5))),
                   do_convert_rgb=bool(c.get("do_convert_rgb", True)))

    @classmethod
    def convnext(cls, size: dict, crop_pct: float, resample: int, mean: tuple, std: tuple,
                 **kw) -> "ImagePreprocessor":
        """ConvNextImageProcessor (ResNet's): below 384 px, resize the short edge to
        int(shortest_edge / crop_pct) then center-crop shortest_edge square; from 384, warp to
        the square (transformers 5.x image_processing_pil_convnext.py)."""
        se = size.get("shortest_edge")
        if not se:
            raise ModelDirError(f"ConvNext-style preprocessor size {size} has no shortest_edge")
        se = int(se)
        if se < 384:
            return cls(size={"shortest_edge": int(se / crop_pct)}, resample=resample,
                       do_center_crop=True, crop_size={"height": se, "width": se},
                       image_mean=mean, image_std=std, **kw)
        return cls(size={"height": se, "width": se}, resample=resample, image_mean=mean,
                   image_std=std, **kw)

    def output_size(self) -> tuple[int, int] | None:
        """(H, W) of every processed image, when fixed by the config (crop or fixed resize)."""
        if self.do_center_crop and self.crop_size:
            return int(self.crop_size["height"]), int(self.crop_size["width"])
        if self.do_resize and "height" in self.size:
            return int(self.size["height"]), int(self.size["width"])
        return None

    def _resize_to(self, h: int, w: int) -> tuple[int, int]:
        s = self.size
        if "shortest_edge" in s and s.get("shortest_edge"):
            short, long = (w, h) if w <= h else (h, w)
            new_short = int(s["shortest_edge"])
            new_long = int(new_short * long / short)
            return (new_long, new_short) if w <= h else (new_short, new_long)
        if "height" in s and "width" in s:
            return int(s["height"]), int(s["width"])
        raise ModelDirError(f"preprocessor size {s} not supported (height/width or shortest_edge)")

    def __call__(self, img) -> np.ndarray:
        """PIL image -> [3, H, W] float32 pixel values."""
        from PIL import Image
        if self.do_convert_rgb:
            img = to_rgb(img)
        if self.do_resize:
            h, w = self._resize_to(img.height, img.width)
            img = img.resize((w, h), resample=Image.Resampling(self.resample), reducing_gap=None)
        a = np.asarray(img)
        a = a[None] if a.ndim == 2 else np.moveaxis(a, -1, 0)
        if self.do_center_crop and self.crop_size:
            a = _center_crop(a, int(self.crop_size["height"]), int(self.crop_size["width"]))
        if self.do_rescale:
            a = (a.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            a = a.astype(np.float32) if not np.issubdtype(a.dtype, np.floating) else a
            mean = np.array(self.image_mean, dtype=a.dtype)[:, None, None]
            std = np.array(self.image_std, dtype=a.dtype)[:, None, None]
            a = (a - mean) / std
        return np.ascontiguousarray(a, dtype=np.float32)


def to_rgb(img):
    """RGB, compositing transparency onto white (as transformers' convert_to_rgb does)."""
    from PIL import Image
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        img = img.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", img.size, (255, 255, 255, 255)),
                                     img).convert("RGB")
    return img.convert("RGB")


def _center_crop(a: np.ndarray, ch: int, cw: int) -> np.ndarray:
    h, w = a.shape[-2:]
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0 and top + ch <= h and left + cw <= w:
        return a[..., top:top + ch, left:left + cw]
    nh, nw = max(ch, h), max(cw, w)                        # smaller than the crop: zero-pad
    out = np.zeros(a.shape[:-2] + (nh, nw), a.dtype)
    tp, lp = math.ceil((nh - h) / 2), math.ceil((nw - w) / 2)
    out[..., tp:tp + h, lp:lp + w] = a
    top, left = (nh - ch) // 2, (nw - cw) // 2
    return out[..., top:top + ch, left:left + cw]


# --- decoding -------------------------------------------------------------------------------------
class ImageInputError(ValueError):
    """An image input that cannot be decoded; the message names it."""


def open_image(data: bytes, what: str):
    """Decoded PIL image from file bytes (PNG, JPEG, WebP, ...), size-checked."""
    from PIL import Image, UnidentifiedImageError
    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise ImageInputError(f"{what}: {img.width}x{img.height} pixels exceeds the limit of "
                                  f"{MAX_IMAGE_PIXELS}")
        img.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise ImageInputError(f"{what}: not an image Pillow can decode ({e})") from None
    return img


def decode_data_url(url: str, what: str):
    """`data:image/png;base64,...` -> PIL image."""
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageInputError(f"{what}: expected a base64 image data URL "
                              f"('data:image/png;base64,...')")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(f"{what}: the data URL's base64 payload is invalid") from None
    return open_image(data, what)


def has_pooler_weights(model_dir: str | Path) -> bool:
    """Whether the checkpoint carries a ViT pooler (dense + tanh); without it the embedding is
    the final-layernormed CLS token, as transformers' pooler-less ViTModel would give."""
    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors"))
    if files:
        from safetensors import safe_open
        for f in files:
            with safe_open(str(f), "pt") as s:
                if any(k.split(".")[-3:-1] == ["pooler", "dense"] or k.startswith("pooler.")
                       for k in s.keys()):
                    return True
        return False
    if (d / "pytorch_model.bin").is_file():
        import torch
        sd = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return any("pooler." in k for k in sd)
    raise ModelDirError(f"{d}: no model.safetensors or pytorch_model.bin")
