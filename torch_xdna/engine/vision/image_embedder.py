"""Image embeddings on the NPU: a ViT / DINOv2 / ResNet Hugging Face directory (transformers' own
model code) compiled with torch.compile(backend="xdna") and run under strict(), so every op of the
network is an NPU launch; preprocessing on the host (models/vision.py).

The embedding is the model's pooled output: DINOv2's pooler_output (final-layernormed CLS);
ViT's pooler (dense + tanh on CLS) when the checkpoint has one, else the final-layernormed CLS;
ResNet's pooler_output (global average pool of the last stage), flattened to [n, channels].
Images run in batches padded to a power of two (<= max_batch), so few shapes are compiled; the
images of a batch do not interact (attention and layer norm are per image), so padding rows
never change a vector.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from torch_xdna.engine.embed.embedder import EmbedStats, SpecNamed, batch_bucket
from torch_xdna.models.hf import ModelDirError, read_config
from torch_xdna.models.vision import IMAGE_TYPES, ImagePreprocessor, has_pooler_weights

MAX_BATCH = 8
RECOMPILE_LIMIT = 64       # compiled shapes per forward code object, across all instances


def allow_recompiles(n: int = RECOMPILE_LIMIT) -> None:
    """Dynamo counts recompiles per code object, so every instance of a model class (several
    served models, batch buckets, tile shapes) shares dynamo's default budget of 8; past it
    dynamo would silently run the module eagerly. Raise the limit (never lower it)."""
    import torch._dynamo
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, n)


@dataclass(frozen=True)
class ImageSpec:
    name: str
    model_type: str
    dim: int
    image_size: int
    patch_size: int
    pooling: str                      # "pooler" | "cls"


class PooledImageModel(torch.nn.Module):
    """The model's pooled vector for a pixel batch (the module the embedder compiles)."""

    def __init__(self, model: torch.nn.Module, interpolate: bool):
        super().__init__()
        self.model, self.interpolate = model, interpolate

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        kw = {"interpolate_pos_encoding": True} if self.interpolate else {}
        out = self.model(pixel_values=pixel_values, **kw)
        if out.pooler_output is not None:
            return out.pooler_output.flatten(1)      # ResNet: [n, C, 1, 1]
        return out.last_hidden_state[:, 0]


def load_hf_image_model(model_dir: Path, model_type: str) -> tuple[torch.nn.Module, bool]:
    """(transformers model in fp32 eval mode, whether it has a pooler head)."""
    try:
        from transformers import Dinov2Model, ResNetModel, ViTModel
    except ImportError:
        raise ModuleNotFoundError("image embeddings run transformers' ViT/DINOv2/ResNet code: "
                                  "pip install transformers") from None
    if model_type == "resnet":
        return ResNetModel.from_pretrained(model_dir, dtype=torch.float32).eval(), True
    if model_type == "vit":
        pooler = has_pooler_weights(model_dir)
        m = ViTModel.from_pretrained(model_dir, add_pooling_layer=pooler, dtype=torch.float32)
    else:
        pooler = True
        m = Dinov2Model.from_pretrained(model_dir, dtype=torch.float32)
    return m.eval(), pooler


class ImageEmbedder(SpecNamed):
    """A ViT/DINOv2/ResNet encoder resident on the device. A lock serializes calls."""

    kind = "image"

    def __init__(self, model_dir: str | Path, name: str | None = None, max_batch: int = MAX_BATCH,
                 cache_dir: str | Path | None = None):
        from torch_xdna.runtime import get_device
        d = Path(model_dir).expanduser()
        cfg = read_config(d)
        mtype = cfg.get("model_type")
        if mtype not in IMAGE_TYPES:
            raise ModelDirError(f"{d}/config.json: model_type {mtype!r} is not an image encoder "
                                f"(supported: {', '.join(IMAGE_TYPES)})")
        model, pooler = load_hf_image_model(d, mtype)
        size = int(cfg.get("image_size", 224))
        dim = int(cfg["hidden_sizes"][-1]) if mtype == "resnet" else int(cfg["hidden_size"])
        # ResNet: one "token" per position of the last stage's 32x-downsampled feature map
        patch = 32 if mtype == "resnet" else int(cfg.get("patch_size", 16))
        self.spec = ImageSpec(name or d.resolve().name, mtype, dim, size, patch,
                              "pooler" if pooler else "cls")
        self.pre = ImagePreprocessor.from_dir(d, mtype, size)
        out = self.pre.output_size()
        self.max_batch = max_batch
        self.dev = get_device()
        self._lock = threading.Lock()
        self.module = PooledImageModel(model, mtype == "vit" and out not in (None, (size, size))).to("xdna")
        opts = {"cache_dir": str(cache_dir)} if cache_dir else {}
        allow_recompiles()
        self.fn = torch.compile(self.module, backend="xdna", dynamic=False, options=opts)

    @classmethod
    def load(cls, model_dir: str | Path, name: str | None = None, **kw) -> "ImageEmbedder":
        return cls(model_dir, name, **kw)

    def tokens(self, pixels: np.ndarray) -> int:
        """Sequence length of one image: its patches + CLS (ResNet: the final feature map's
        positions), reported as usage tokens."""
        p = self.spec.patch_size
        cls_token = 0 if self.spec.model_type == "resnet" else 1
        return max(1, (pixels.shape[-2] // p) * (pixels.shape[-1] // p)) + cls_token

    def preprocess(self, images: list) -> list[np.ndarray]:
        return [self.pre(img) for img in images]

    def embed_pixels(self, pixels: list[np.ndarray], stats: EmbedStats | None = None) -> torch.Tensor:
        """Preprocessed [3, H, W] arrays -> [n, dim] fp32 vectors, on the device under strict()."""
        stats = stats if stats is not None else EmbedStats()
        out = torch.empty(len(pixels), self.dim)
        t0 = time.perf_counter()
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(pixels):
            groups.setdefault(p.shape, []).append(i)
        with self._lock, torch.no_grad(), torch.xdna.strict():
            for shape, idx in groups.items():
                for k in range(0, len(idx), self.max_batch):
                    part = idx[k:k + self.max_batch]
                    b = batch_bucket(len(part), self.max_batch)
                    x = torch.zeros((b,) + shape)
                    x[:len(part)] = torch.from_numpy(np.stack([pixels[i] for i in part]))
                    with stats.counting(self.dev, [(b,) + tuple(shape)]):
                        y = self.fn(x.to("xdna")).cpu()
                    out[part] = y[:len(part)].float()
        stats.inputs += len(pixels)
        stats.tokens += sum(self.tokens(p) for p in pixels)
        stats.host_s += time.perf_counter() - t0
        return out

    def embed_images(self, images: list, stats: EmbedStats | None = None) -> torch.Tensor:
        """PIL images -> [n, dim] vectors."""
        return self.embed_pixels(self.preprocess(images), stats)

    def warm_up(self) -> None:
        """Compile (and plan) the one-image shape, so a first request does not pay for it."""
        from PIL import Image
        h, w = self.pre.output_size() or (self.spec.image_size, self.spec.image_size)
        self.embed_images([Image.new("RGB", (w, h))])

    def close(self) -> None:
        """Drop the device copy of the weights."""
        with self._lock:
            self.module.to("cpu")
            self.fn = None
