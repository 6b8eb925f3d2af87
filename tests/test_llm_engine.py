"""The decode engine against transformers (fp32 HF models with the same weights).

Tolerances: precision "fp32" (verification mode, operands not rounded) must agree to fp32
round-off (1e-4 abs on logits of scale ~2-3) and give identical greedy sequences; "bf16" (the NPU
numerics: bf16 operands, fp32 accumulation) within 5% of the logit scale; int8/int4 against an HF
model whose weights were replaced by their dequantized values (fake quantization) within 5%, and
against the unquantized model loosely (int8 10%, int4 60%: 4-bit random weights are the worst
case for quantization noise).
"""
from __future__ import annotations

import pytest
import torch

from llm_fixtures import build_model, hf_logits, teacher_forced
from torch_xdna.engine.llm.decoder import DEFAULT_LAYOUT, LAYOUTS
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.engine.llm.quantize import quantize
from torch_xdna.kernels.blocks.weights import dequantize

FAMILIES = ("qwen3", "llama", "gemma3")
PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]      # 12 tokens (> gemma window 8)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, build_model(request.param, path)


def _engine(path, precision, layout=DEFAULT_LAYOUT):
    return load_decoder(path, precision, max_context=96, prefill_chunk=8, quiet=True,
                        cache_dir=False, layout=layout)


_teacher_forced = teacher_forced


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    out = []
    for _ in range(n):
        t = int(hf_logits(model, ids)[-1].argmax())
        out.append(t)
        ids.append(t)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_logits_match_transformers(model, layout):
    fam, path, hf = model
    eng = _engine(path, "fp32", layout)
    ids = PROMPT + [200, 150, 9, 31, 280, 11]
    ref = hf_logits(hf, ids)
    got = _teacher_forced(eng, ids, len(PROMPT))      # prefill is chunked: 8 + 4 rows
    for j, g in enumerate(got):
        diff = (g - ref[len(PROMPT) - 1 + j]).abs().max().item()
        assert diff < 1e-4, f"{fam}/{layout} step {j}: max |diff| {diff}"
    eng.close()


def test_fp32_greedy_identical_to_transformers(model):
    fam, path, hf = model
    eng = _engine(path, "fp32")
    r = eng.complete(PROMPT, GenerationConfig(max_tokens=32, stop_token_ids=()))
    assert r.finish_reason == "length" and len(r.token_ids) == 32
    assert r.token_ids == _hf_greedy(hf, PROMPT, 32), fam
    assert r.stats.dispatches_per_token == 1.0
    assert r.stats.launches_per_token == hf.config.num_hidden_layers + 2     # 1 per layer
    eng.close()


def test_bf16_logits_close_to_transformers(model):
    fam, path, hf = model
    eng = _engine(path, "bf16")
    ids = PROMPT + [200, 150, 9, 31]
    ref = hf_logits(hf, ids)
    scale = ref.abs().max().item()
    for j, g in enumerate(_teacher_forced(eng, ids, len(PROMPT))):
        diff = (g - ref[len(PROMPT) - 1 + j]).abs().max().item()
        assert diff < 0.05 * scale, f"{fam} step {j}: {diff} vs scale {scale}"
        assert diff > 0, "bf16 numerics should differ from fp32 somewhere"
    eng.close()


@pytest.mark.parametrize("precision,fake_tol,loose_tol", [("int8", 0.05, 0.10), ("int4", 0.05, 0.6)])
def test_quantized_decode_close(model, precision, fake_tol, loose_tol):
    fam, path, hf = model
    eng = _engine(path, precision)
    ids = PROMPT + [200, 150]
    got = _teacher_forced(eng, ids, len(PROMPT))
    ref = hf_logits(hf, ids)
    scale = ref.abs().max().item()
    for j, g in enumerate(got):
        assert (g - ref[len(PROMPT) - 1 + j]).abs().max().item() < loose_tol * scale
    # same weights, dequantized into the fp32 HF model: only bf16 operand rounding remains
    fake = type(hf)(hf.config).eval()
    fake.load_state_dict(hf.state_dict())
    pol = eng.decoder.policy
    with torch.no_grad():
        for name, p in fake.named_parameters():
            if p.dim() == 2:
                kind = "mlp" if ".mlp." in name else "attention" if ".self_attn." in name else "head"
                g = pol.block_group(eng.spec, kind)
                p.copy_(dequantize(quantize(p, precision, g), precision, g))
    ref_fake = hf_logits(fake, ids)
    for j, g in enumerate(got):
        diff = (g - ref_fake[len(PROMPT) - 1 + j]).abs().max().item()
        assert diff < fake_tol * scale, f"{fam} {precision} step {j}: {diff}"
    eng.close()
