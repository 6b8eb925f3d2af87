"""Vision-language chat on the decoder engine (Gemma 3).

Images in chat messages -> host preprocessing (models/vision.py, the directory's
preprocessor_config.json) -> the SigLIP tower and Gemma 3's multimodal projector (transformers'
own modules, compiled with torch.compile(backend="xdna") and run under strict(), so every op is
an NPU launch, as engine/vision/image_embedder.py runs ViT) -> one fp32 row per image soft token.
The prompt's <image_soft_token> placeholders take those rows after the embedding launch
(Decoder.forward_images) and each image's block of soft tokens attends bidirectionally in
prefill, as transformers 5.25's Gemma3Model does when token_type_ids are given (its processor
always gives them): full layers OR(causal, same image), sliding layers AND(window, that).
Decoding is the ordinary loop. Precision "fp32" (the verification mode) runs the tower on the
host in fp32, matching transformers; it is not what the NPU computes.

Image prompts bypass the prefix cache: their token ids do not identify the image.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import torch

from torch_xdna.engine.llm.generate import Engine, Prompt, load_decoder
from torch_xdna.engine.llm.image_prefill import ImageDecoder
from torch_xdna.models.hf import ModelDirError, read_config
from torch_xdna.models.vlm import (VisionLanguageSpec, expand_images, image_preprocessor,
                                   image_spans, vision_state_dict, vlm_spec)


class ImagePrompt(list):
    """Prompt token ids that also carry their images' pixel values ([3, H, W] float32 arrays,
    in prompt order), so they travel through the server like any list of ids."""

    def __init__(self, ids: list[int], images: list[np.ndarray]):
        super().__init__(ids)
        self.images = images


class TowerModule(torch.nn.Module):
    """SigLIP vision tower + Gemma 3 projector: pixels [n, 3, S, S] -> [n, mm_tokens, hidden]."""

    def __init__(self, cfg: Any):
        """cfg: a transformers Gemma3Config (random weights until loaded)."""
        super().__init__()
        from transformers import SiglipVisionModel
        from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector
        self.vision_tower = SiglipVisionModel(cfg.vision_config)
        self.multi_modal_projector = Gemma3MultiModalProjector(cfg)
        self.float().eval()

    @staticmethod
    def config(model_dir: Path, image_size: int | None = None) -> Any:
        """The directory's Gemma3Config (vision_config.image_size replaced when given)."""
        try:
            from transformers import Gemma3Config
        except ImportError:
            raise ModuleNotFoundError("image input runs transformers' SigLIP and Gemma 3 "
                                      "projector code: pip install transformers") from None
        cfg = Gemma3Config.from_pretrained(model_dir)
        if image_size:
            cfg.vision_config.image_size = int(image_size)
        return cfg

    @classmethod
    def load(cls, model_dir: Path) -> "TowerModule":
        m = cls(cls.config(model_dir))
        missing, unexpected = m.load_state_dict(vision_state_dict(model_dir), strict=False)
        if missing or unexpected:
            raise ModelDirError(f"{model_dir}: vision weights do not match config.json "
                                f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
        return m

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        h = self.vision_tower(pixel_values=pixel_values).last_hidden_state
        return self.multi_modal_projector(h)


class PatchEmbed(torch.nn.Module):
    """SigLIP's patch Conv2d (kernel = stride = patch) as patch rows x the flattened kernel: the
    same products and sums, a GEMM instead of a convolution (the array's conv designs take no
    14 x 14 kernel, Gemma 3's patch size)."""

    def __init__(self, conv: torch.nn.Conv2d):
        super().__init__()
        self.p = int(conv.kernel_size[0])
        self.weight = torch.nn.Parameter(conv.weight.detach().reshape(conv.out_channels, -1).t()
                                         .contiguous(), requires_grad=False)
        self.bias = torch.nn.Parameter(conv.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p, gh, gw = self.p, x.shape[2] // self.p, x.shape[3] // self.p
        rows = x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)
        y = torch.addmm(self.bias, rows.reshape(b * gh * gw, -1), self.weight)
        return y.reshape(b, gh, gw, -1).permute(0, 3, 1, 2)      # [b, C, gh, gw], as the conv


class VisionTower:
    """The image side on one device: `rows(pixels)` -> [n * mm_tokens, hidden] fp32."""

    def __init__(self, module: TowerModule, spec: VisionLanguageSpec | None, exact: bool):
        self.spec, self.exact = spec, exact
        self.module = module
        if exact:
            self.fn: Callable = self.module
        else:
            from torch_xdna.engine.vision.image_embedder import allow_recompiles
            emb = self.module.vision_tower.embeddings
            emb.patch_embedding = PatchEmbed(emb.patch_embedding)
            self.module.to("xdna")
            allow_recompiles()
            self.fn = torch.compile(self.module, backend="xdna", dynamic=False)

    def rows(self, pixels: list[np.ndarray]) -> torch.Tensor:
        """One image at a time (the compiled shape is one image), rows in prompt order."""
        out = []
        with torch.no_grad():
            for p in pixels:
                x = torch.from_numpy(np.ascontiguousarray(p))[None]
                if self.exact:
                    out.append(self.fn(x)[0].float())
                else:
                    with torch.xdna.strict():
                        out.append(self.fn(x.to("xdna")).cpu()[0].float())
        return torch.cat(out) if out else torch.empty(0, self.spec.text_hidden if self.spec else 0)

    def close(self) -> None:
        self.module.to("cpu")


def message_images(messages: Any) -> bool:
    """Whether chat `messages` hold an image part ({"type": "image", "image": PIL image})."""
    if not isinstance(messages, (list, tuple)):
        return False
    return any(isinstance(m, Mapping) and isinstance(m.get("content"), list)
               and any(isinstance(p, Mapping) and p.get("type") == "image" for p in m["content"])
               for m in messages)


class VisionEngine(Engine):
    """An Engine whose chat messages may carry images (content parts {"type": "image",
    "image": PIL image} beside {"type": "text", "text": ...})."""

    accepts_images = True

    def __init__(self, base: Engine, spec: VisionLanguageSpec, tower: VisionTower, pre):
        super().__init__(base.files, base.decoder, base.tokenizer)
        self.prefix_cache = base.prefix_cache
        self.vlm, self.tower, self.pre = spec, tower, pre

    def encode_prompt(self, prompt: Prompt, chat_kwargs: Mapping | None = None) -> list[int]:
        if isinstance(prompt, ImagePrompt):
            return prompt
        if not message_images(prompt):
            return super().encode_prompt(prompt, chat_kwargs)
        images, msgs = [], []
        for m in prompt:
            content = m.get("content")
            if isinstance(content, list):
                parts = []
                for p in content:
                    if p.get("type") == "image":
                        images.append(self.pre(p["image"]))
                        parts.append({"type": "image"})
                    else:
                        parts.append(dict(p))
                m = {**m, "content": parts}
            msgs.append(dict(m))
        tok = self._tok()
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, **dict(chat_kwargs or {}))
        ids = tok.encode(expand_images(text, self.vlm, tok.tok.id_to_token),
                         add_special_tokens=False)
        if ids.count(self.vlm.boi_token_id) != len(images):
            raise ValueError(f"the chat template wrote {ids.count(self.vlm.boi_token_id)} "
                             f"<start_of_image> tokens for {len(images)} images")
        return ImagePrompt(ids, images)

    def prefill_for(self, ids: list[int]) -> Callable[[list[int]], torch.Tensor] | None:
        """The image prompt's prefill: tower rows into the placeholders, blocks bidirectional."""
        if not isinstance(ids, ImagePrompt) or not ids.images:
            return None
        spec, dec = self.vlm, self.decoder

        def prefill(_rest: list[int]) -> torch.Tensor:
            rows = self.tower.rows(ids.images)
            at = [i for i, t in enumerate(ids) if t == spec.image_token_id]
            if len(at) != rows.shape[0]:
                raise ValueError(f"the prompt has {len(at)} image soft tokens for "
                                 f"{rows.shape[0]} image rows ({len(ids.images)} images)")
            # an out-of-vocabulary placeholder embeds as token 0 (transformers does the same)
            plain = [0 if t == spec.image_token_id and t >= dec.vocab else t for t in ids]
            return dec.forward_images(plain, rows, at, image_spans(list(ids), spec.image_token_id))
        return prefill

    def close(self) -> None:
        super().close()
        self.tower.close()


def load_vlm(model_dir: str | Path, precision: str = "native", **kw: Any) -> VisionEngine:
    """load_decoder for a vision-language directory (its text decoder, able to prefill image
    rows: engine/llm/image_prefill.py), plus its vision tower on the same device."""
    d = Path(model_dir)
    spec = vlm_spec(read_config(d), str(d / "config.json"))
    pre = image_preprocessor(d, spec)
    base = load_decoder(d, precision, decoder_cls=ImageDecoder, **kw)
    tower = VisionTower(TowerModule.load(d), spec, exact=base.decoder.policy.exact)
    return VisionEngine(base, spec, tower, pre)
