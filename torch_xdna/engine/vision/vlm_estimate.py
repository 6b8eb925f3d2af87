"""`xdna estimate DIR` for a vision-language directory (Gemma 3): modeled time to first token of
an image prompt = the SigLIP tower + projector for each image + the prefill of the prompt's
tokens (the image soft tokens and the text), per tower resolution, from config.json alone
(random weights of the same shapes: the cost model depends on shapes, not values).

Gemma 3 resizes every image to vision_config.image_size (pan-and-scan off), so the uploaded
image's resolution does not change the time; `sizes` models towers built for other sizes (a
checkpoint whose vision_config.image_size is that, same tokens per image). Every figure is the
simulator's cost model (modeled), none a measurement; the tower runs compiled under strict()
as the engine runs it, the prefill is engine/llm/decoder.py's estimate_step over the chunks.
Each is charged as the first program on the array: the engine's own sequence also pays the
switch from the tower's program to the decoder's (at the test's micro shapes ~1 ms of ~9 ms;
tests/test_vlm.py checks the estimate within 15% of what the engine is charged).
"""
from __future__ import annotations

from pathlib import Path

import torch

from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.engine.llm.decoder import DEFAULT_CHUNK, PrecisionPolicy, estimate_step, plan_chunk
from torch_xdna.engine.llm.image_prefill import chunk_cuts, wide_designs
from torch_xdna.engine.llm.estimate import default_generation
from torch_xdna.engine.llm.vlm import TowerModule, VisionTower
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.models.families import spec_from_config
from torch_xdna.models.hf import read_config
from torch_xdna.models.vlm import vlm_spec
from torch_xdna.runtime.sim.cost import CostModel

EXTRA_PER_IMAGE = 4     # <start_of_image>, <end_of_image> and the "\n\n" on each side
PROMPT_LEAD = 4         # text tokens before the (first) image: <bos><start_of_turn>user\n


def tower_ms(model_dir: Path, size: int) -> float:
    """Modeled NPU ms of one image through the tower + projector at `size` pixels a side."""
    from torch_xdna.runtime import get_device
    torch.manual_seed(0)
    m = VisionTower(TowerModule(TowerModule.config(model_dir, size)), None, exact=False)
    fn = m.fn
    x = torch.randn(1, 3, size, size).to("xdna")
    dev = get_device()
    with torch.no_grad(), torch.xdna.strict():
        fn(x)                                                   # compile + plan
        us0 = dev.counters.modeled_us
        fn(x)
        return (dev.counters.modeled_us - us0) / 1e3


def prefill_ms(spec, policy: PrecisionPolicy, tokens: int, blocks: list[tuple[int, int]],
               requested: int = DEFAULT_CHUNK) -> float:
    """Modeled ms to prefill a `tokens` prompt from an empty cache whose image soft tokens are
    the index ranges `blocks`, in the chunks the engine takes (engine/llm/image_prefill.py:
    chunk_cuts; a block longer than a chunk as one wide chunk)."""
    gen = default_generation()
    cap = tokens + 1
    chunk = plan_chunk(spec, policy, cap, requested, gen)
    cost, memo, us = CostModel(gen), {}, 0.0
    for start, end, rows in chunk_cuts(tokens, chunk, blocks):
        n, last = end - start, end == tokens
        img = any(start <= a < end for a, _ in blocks)
        if rows == chunk:
            us += estimate_step(spec, policy, cost, rows_bucket(n, chunk), start, n, cap, last,
                                memo=memo, images=img)["modeled_us"]
            continue
        designs = [d for _, _, d in wide_designs(spec, policy, rows, chunk, cap, last,
                                                 DEFAULT_KV_DTYPE)]
        plans = [d.launch_plan(gen, pos=start, n=n) if hasattr(d, "launch_plan")
                 else d.plan(gen) for d in designs]
        terms = cost.charge_program([(d.key, p, d.runs()) for d, p in zip(designs, plans)])
        us += sum(t.total for t in terms)
    return us / 1e3


def estimate_vlm(model_dir: str | Path, sizes: list[int] | None = None,
                 precisions: tuple[str, ...] = ("bf16", "int4"), text_tokens: int = 32,
                 images: int = 1) -> dict:
    """Modeled TTFT rows (precision x tower size) for `images` images and `text_tokens` text."""
    d = Path(model_dir)
    cfg = read_config(d)
    vs, spec = vlm_spec(cfg, str(d / "config.json")), spec_from_config(cfg)
    tokens = text_tokens + images * (vs.tokens_per_image + EXTRA_PER_IMAGE)
    lead = min(PROMPT_LEAD, text_tokens) + 2          # the turn header, "\n\n", <start_of_image>
    per = vs.tokens_per_image + EXTRA_PER_IMAGE
    blocks = [(lead + k * per, lead + k * per + vs.tokens_per_image) for k in range(images)]
    rows = []
    for size in sizes or [vs.image_size]:
        if size % vs.patch_size or (size // vs.patch_size) % round(vs.tokens_per_image ** 0.5):
            raise ValueError(f"image size {size}: the {size // vs.patch_size} patches a side "
                             f"must pool to {round(vs.tokens_per_image ** 0.5)} tokens a side "
                             f"(patch {vs.patch_size})")
        t_ms = tower_ms(d, size)
        for p in precisions:
            pf = prefill_ms(spec, PrecisionPolicy.parse(p), tokens, blocks)
            rows.append({"precision": p, "image_size": size, "images": images,
                         "prompt_tokens": tokens, "modeled_tower_ms_per_image": t_ms,
                         "modeled_prefill_ms": pf, "modeled_ttft_ms": images * t_ms + pf})
    return {"model": d.name, "kind": "vision-language", "family": spec.family,
            "tokens_per_image": vs.tokens_per_image, "native_image_size": vs.image_size,
            "generation": default_generation().name, "results": rows}


def describe(r: dict) -> str:
    head = (f"{r['model']}: {r['family']} vision-language, {r['tokens_per_image']} soft tokens "
            f"per image (every image resized to {r['native_image_size']} px), {r['generation']}; "
            f"modeled by the simulator's cost model")
    lines = [head, "  precision  image px  prompt tok  tower ms/img  prefill ms  TTFT ms"]
    for x in r["results"]:
        lines.append(f"  {x['precision']:>9}  {x['image_size']:>8}  {x['prompt_tokens']:>10}  "
                     f"{x['modeled_tower_ms_per_image']:>12.2f}  {x['modeled_prefill_ms']:>10.2f}"
                     f"  {x['modeled_ttft_ms']:>7.2f}")
    return "\n".join(lines)
