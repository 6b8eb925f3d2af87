"""Vision-language checkpoints (Gemma 3): what config.json says about the image side, the
image prompt's token layout, and the SigLIP tower + projector weights.

The decoder of a multimodal gemma3 directory is its text_config (models/families.py); this
module holds the rest: the image token ids, how many soft tokens an image becomes, the
preprocessor (models/vision.py's, from preprocessor_config.json) and the vision weights, read
from the same safetensors files. The prompt layout follows transformers 5.x
processing_gemma3.py: each <start_of_image> the chat template emits becomes
"\\n\\n<start_of_image>" + mm_tokens_per_image x <image_soft_token> + "<end_of_image>\\n\\n".
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from torch_xdna.models.hf import ModelDirError, read_config
from torch_xdna.models.vision import ImagePreprocessor

VLM_TYPES = ("gemma3",)        # model_type values whose directories take images


@dataclass(frozen=True)
class VisionLanguageSpec:
    """The image side of a vision-language directory."""

    model_type: str
    image_token_id: int        # <image_soft_token>: one per projected image row
    boi_token_id: int          # <start_of_image>, what the chat template writes for an image
    eoi_token_id: int          # <end_of_image>
    tokens_per_image: int      # mm_tokens_per_image
    image_size: int
    patch_size: int
    vision_hidden: int
    vision_layers: int
    vision_intermediate: int
    vision_heads: int
    text_hidden: int


def is_vlm_dir(model_dir: str | Path) -> bool:
    """Whether `model_dir` is a vision-language checkpoint this package serves with images."""
    d = Path(model_dir)
    return d.is_dir() and (d / "config.json").is_file() and \
        read_config(d).get("model_type") in VLM_TYPES and "vision_config" in read_config(d)


def vlm_spec(cfg: dict, where: str = "config.json") -> VisionLanguageSpec:
    """The VisionLanguageSpec of a multimodal gemma3 config dict (ModelDirError names a
    missing or unsupported field)."""
    if cfg.get("model_type") not in VLM_TYPES:
        raise ModelDirError(f"{where}: model_type {cfg.get('model_type')!r} takes no images "
                            f"(image input: {', '.join(VLM_TYPES)})")
    v, t = cfg.get("vision_config") or {}, cfg.get("text_config") or {}
    if v.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        raise ModelDirError(f"{where}: vision_config.model_type {v.get('model_type')!r} is not "
                            f"supported (siglip_vision_model)")
    if v.get("vision_use_head"):
        raise ModelDirError(f"{where}: vision_config.vision_use_head is set; Gemma 3 projects "
                            f"the tower's patch states, not a pooled head")
    size, patch = int(v.get("image_size", 224)), int(v.get("patch_size", 16))
    mm = int(cfg.get("mm_tokens_per_image", 256))
    side, per = round(mm ** 0.5), size // patch
    if side * side != mm or per % side:
        raise ModelDirError(f"{where}: mm_tokens_per_image {mm} must be a square whose side "
                            f"divides the {per} patches per side of the vision tower")
    return VisionLanguageSpec(
        cfg["model_type"], int(cfg.get("image_token_index", 262144)),
        int(cfg.get("boi_token_index", 255999)), int(cfg.get("eoi_token_index", 256000)), mm,
        size, patch, int(v.get("hidden_size", 768)), int(v.get("num_hidden_layers", 12)),
        int(v.get("intermediate_size", 3072)), int(v.get("num_attention_heads", 12)),
        int(t.get("hidden_size", 2304)))


def image_preprocessor(model_dir: Path, spec: VisionLanguageSpec) -> ImagePreprocessor:
    """Gemma3ImageProcessor's fields (resize to image_size, rescale, normalize to [-1, 1]);
    pan-and-scan crops are refused by name (not implemented)."""
    p = model_dir / "preprocessor_config.json"
    if p.is_file():
        import json
        if json.loads(p.read_text()).get("do_pan_and_scan"):
            raise ModelDirError(f"{p}: do_pan_and_scan is not implemented; set it to false")
        return ImagePreprocessor.from_dir(model_dir, spec.model_type, spec.image_size)
    return ImagePreprocessor(size={"height": spec.image_size, "width": spec.image_size})


def expand_images(text: str, spec: VisionLanguageSpec, token: Callable[[int], str | None]) -> str:
    """A rendered prompt with each <start_of_image> replaced by the processor's full image
    sequence, as text (tokenized afterwards, like the processor, so newlines merge the same
    way). token: id -> token string of this tokenizer."""
    boi, eoi, img = (token(i) for i in (spec.boi_token_id, spec.eoi_token_id, spec.image_token_id))
    if not (boi and eoi and img):
        raise ModelDirError(f"the tokenizer has no token for boi/eoi/image ids "
                            f"{spec.boi_token_id}/{spec.eoi_token_id}/{spec.image_token_id}")
    return text.replace(boi, f"\n\n{boi}{img * spec.tokens_per_image}{eoi}\n\n")


def image_spans(ids: list[int], image_token_id: int) -> list[tuple[int, int]]:
    """(start, end) index ranges of consecutive image soft tokens: the blocks that attend
    bidirectionally (transformers' token_type_ids == 1 groups)."""
    spans, start = [], None
    for i, t in enumerate(ids + [-1]):
        if t == image_token_id and start is None:
            start = i
        elif t != image_token_id and start is not None:
            spans.append((start, i))
            start = None
    return spans


def vision_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """The SigLIP tower's and projector's tensors, named as a module with `vision_tower`
    (transformers 5's SiglipVisionModel, whose parameters sit directly under it) and
    `multi_modal_projector` children: from the original checkpoint names
    (vision_tower.vision_model.*) or transformers 5's saved ones (vision_tower.*)."""
    from safetensors import safe_open
    from torch_xdna.models.hf import safetensors_files
    out = {}
    for f in safetensors_files(model_dir):      # only the image side's tensors are read
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                name = key.removeprefix("model.")
                if name.startswith("vision_tower."):
                    rest = name.removeprefix("vision_tower.").removeprefix("vision_model.")
                    out["vision_tower." + rest] = fh.get_tensor(key)
                elif name.startswith("multi_modal_projector."):
                    out[name] = fh.get_tensor(key)
    if not out:
        raise ModelDirError(f"{model_dir}: no vision_tower.* / multi_modal_projector.* weights; "
                            f"this is not a vision-language checkpoint")
    return out
