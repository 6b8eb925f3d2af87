"""A tiny random-weight Gemma 3 vision-language directory (Gemma3ForConditionalGeneration: SigLIP
tower + projector + gemma3_text decoder) for the image-chat tests: small dims, the real
structure, saved with save_pretrained, plus an offline BPE tokenizer carrying Gemma 3's special
tokens, a Gemma-3-style chat template and a Gemma3ImageProcessor config. Nothing downloads."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import torch

import llm_fixtures
from llm_fixtures import VOCAB

SPECIALS = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
            "<end_of_image>", "<image_soft_token>"]
BOI, EOI, IMAGE = 5, 6, 7
MM_TOKENS = 4                       # 2 x 2 soft tokens per image (4 x 4 patches, pooled 2 x 2)
IMAGE_SIZE = 32
# Gemma 3's template, shortened: system text joins the first user turn, images are
# <start_of_image>, the assistant role is "model"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% set first = '' %}{% set msgs = messages %}"
    "{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\n\n' %}"
    "{% set msgs = messages[1:] %}{% endif %}"
    "{% for m in msgs %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if loop.first %}{{ first }}{% endif %}"
    "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}<start_of_image>"
    "{% elif p['type'] == 'text' %}{{ p['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


def save_tokenizer(path: Path) -> None:
    llm_fixtures.save_tokenizer(path, SPECIALS, {
        "bos_token": "<bos>", "eos_token": "<end_of_turn>", "pad_token": "<pad>",
        "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
        "image_token": "<image_soft_token>", "chat_template": CHAT_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast"})


def save_processor(path: Path) -> None:
    (path / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
        "do_resize": True, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "resample": 2,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "do_pan_and_scan": False}))
    (path / "processor_config.json").write_text(json.dumps({
        "processor_class": "Gemma3Processor", "image_seq_length": MM_TOKENS}))


def config(window: int = 8):
    from transformers import Gemma3Config
    text = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, head_dim=16,
                max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.08,
                bos_token_id=1, eos_token_id=4, pad_token_id=0, intermediate_size=128,
                num_hidden_layers=4, num_key_value_heads=1, sliding_window=window,
                layer_types=["sliding_attention", "full_attention"] * 2,
                query_pre_attn_scalar=24, final_logit_softcapping=30.0,
                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                    "rope_theta": 1e6},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=8,
                  layer_norm_eps=1e-6, vision_use_head=False)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=MM_TOKENS,
                        boi_token_index=BOI, eoi_token_index=EOI, image_token_index=IMAGE,
                        initializer_range=0.08)


def build_vlm(path: Path, seed: int = 0):
    """Save the tiny Gemma 3 VLM to `path`; returns the fp32 HF model (eager attention, eval)."""
    from transformers import Gemma3ForConditionalGeneration
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration._from_config(config(), attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:                 # non-trivial norm weights exercise (1+w) vs w
                p.add_(torch.randn_like(p) * 0.2)
            if "mm_input_projection" in name:  # zeros at init: give the image a voice
                p.normal_(0, 0.3)
    model = model.float().eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    save_tokenizer(path)
    save_processor(path)
    return model


def sample_image(seed: int = 1, size: tuple[int, int] = (40, 28)):
    """A small random RGB PIL image (not square: the resize matters)."""
    from PIL import Image
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8).numpy()
    return Image.fromarray(a, "RGB")


def png_b64(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def hf_pixels(img) -> torch.Tensor:
    """transformers' Gemma3 image processor (PIL backend) on `img`: [1, 3, S, S]."""
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    proc = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
                                   do_pan_and_scan=False)
    return proc(images=[img], return_tensors="pt")["pixel_values"]


def hf_greedy_image(model, ids: list[int], pixels: torch.Tensor, n: int) -> list[int]:
    """transformers' greedy tokens for an image prompt (token_type_ids as its processor gives)."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(input_ids=x, pixel_values=pixels, attention_mask=torch.ones_like(x),
                             token_type_ids=(x == IMAGE).long(), max_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=n)
    return out[0, len(ids):].tolist()
