"""The newer decoder families against transformers, one set of checks for each: Qwen3-MoE
(mixture of experts, tests/test_moe.py for its charging), OPT (learned positions, LayerNorm,
biases, ReLU MLP; tests/test_opt.py) and Qwen3.5 (gated DeltaNet linear attention + gated full
attention; tests/test_qwen3_5.py for long prompts and its states).

Random-weight directories built from transformers configs (llm_fixtures.build_model) and loaded
by the engine's own loader. fp32 verification mode: logits within 1e-4 and greedy tokens
identical over 32 tokens (a 12-token prompt prefilled in 8-row chunks: a chunk boundary inside
the prompt); bf16 / int8 / int4: within a share of the logit scale (4-bit random weights are the
worst case for quantization noise); batched decode equals each sequence decoded alone.
"""
from __future__ import annotations

import pytest

from llm_fixtures import (batched_and_alone, build_model, check_against_transformers,
                          check_greedy_identical, fake_quantized, served_answers)
from torch_xdna.engine.llm.decoder import LAYOUTS
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder

FAMILIES = ("qwen3_moe", "opt", "qwen3_5")
PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, build_model(request.param, path)


def _engine(path, precision, layout="layer"):
    return load_decoder(path, precision, max_context=96, prefill_chunk=8, quiet=True,
                        cache_dir=False, layout=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fp32_logits_match_transformers(model, layout):
    path, hf = model
    eng = _engine(path, "fp32", layout)
    check_against_transformers(eng, hf, PROMPT, None)
    eng.close()


def test_fp32_greedy_identical_to_transformers(model):
    path, hf = model
    eng = _engine(path, "fp32")
    check_greedy_identical(eng, hf, PROMPT)
    eng.close()


# bf16 numerics against the fp32 model, as a share of the logit scale: the random hybrid's
# DeltaNet layers (16-dim L2-normed keys, gates from the same projection) amplify operand
# rounding (measured 7.5% at the 13th token), the others stay under 5%
BF16_TOL = {"qwen3_5": 0.10}
# quantized MoE against fake quantization: where bf16 rounding flips a near-tie of the router's
# top-k, a row takes another expert (measured 17.6% of the logit scale, int4, 2nd step)
QUANT_TOL = {"qwen3_moe": 0.20, "qwen3_5": 0.10}


def test_bf16_close_to_transformers(model):
    path, hf = model
    eng = _engine(path, "bf16")
    check_against_transformers(eng, hf, PROMPT, BF16_TOL.get(eng.spec.family, 0.05),
                               extra=(200, 150))
    eng.close()


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_close_to_fake_quantized_transformers(model, precision):
    """Against transformers with the same dequantized weights: what remains is bf16 rounding
    (4-bit random weights move the unquantized logits by up to 100% for the hybrid)."""
    path, hf = model
    eng = _engine(path, precision)
    check_against_transformers(eng, fake_quantized(hf, eng, precision), PROMPT,
                               QUANT_TOL.get(eng.spec.family, 0.05), extra=(200, 150))
    eng.close()


def test_batched_decode_equals_alone(model):
    """Continuous batching: each row at its own position (OPT's position table) and with its
    own routing (MoE) gives the tokens it gets alone."""
    from torch_xdna.engine.llm.batching import unsupported
    path, _ = model
    eng = load_decoder(path, "bf16", max_context=96, quiet=True, cache_dir=False, prefix_cache=0)
    prompts, cfg = [PROMPT, PROMPT[3:9], [7, 8]], GenerationConfig(max_tokens=5, stop_token_ids=())
    if eng.spec.layer_kinds:          # slots hold KV only: a hybrid model decodes alone
        assert unsupported(eng, cfg) == "linear_attention"
        eng.close()
        return
    batched, alone = batched_and_alone(eng, prompts, cfg)
    assert batched == alone
    eng.close()


def test_served_like_the_dense_decoders(model):
    """OpenAI chat (three concurrent requests: batched, or one by one for the hybrid; one
    streamed) and Ollama /api/chat on the directory: each answer is the engine's own greedy
    text."""
    path, _ = model
    msgs = [{"role": "user", "content": "hello world"}]
    eng = load_decoder(path, "bf16", quiet=True, cache_dir=False)
    want = eng.complete(msgs, GenerationConfig(max_tokens=6, stop_token_ids=())).text
    eng.close()
    assert served_answers(path, msgs) == {"openai": [want] * 3, "stream": want, "ollama": want}
