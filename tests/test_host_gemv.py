"""The decode host kernel (kernels/host/gemv.py): bf16 weights, fp32 accumulation, fp32 result.

Checked against an fp64 reference of the same bf16 operands: every product of two bf16 values is
exact in fp32, so the kernel's only error is the association of its fp32 sum, bounded (fp32
summation, unit roundoff u = 2^-24) by K * u * sum|x_k w_k| per element. Exact cases (partial
sums representable) must be bit exact. A row's bits must not depend on the other rows or on the
thread count. The engine must give the same greedy tokens with and without it on the test
models (tests/llm_fixtures.py) and logits within fp32-reordering distance.
"""
from __future__ import annotations

import pytest
import torch

from torch_xdna.kernels import quant

from torch_xdna.kernels.host import gemv as host_gemv
from torch_xdna.kernels.blocks.operands import OPERANDS

pytestmark = pytest.mark.skipif(not host_gemv.available(),
                                reason=f"host kernel unavailable: {host_gemv.unavailable_reason()}")


def _ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.double() @ w.double().t()


@pytest.mark.parametrize("m,k,n", [(1, 1024, 300), (3, 1000, 77), (8, 37, 64), (2, 5, 9)])
def test_within_fp32_summation_bound(m, k, n):
    g = torch.Generator().manual_seed(k + n)
    x = torch.randn(m, k, generator=g).bfloat16().float()
    w = torch.randn(n, k, generator=g).bfloat16()
    y = host_gemv.bf16_linear(x, w)
    assert y.dtype == torch.float32 and y.shape == (m, n)
    bound = k * 2.0 ** -24 * (x.abs().double() @ w.double().abs().t())
    assert bool(((y.double() - _ref(x, w)).abs() <= bound).all())


def test_exact_when_sums_are_representable():
    # small integers: every product and partial sum is exact in fp32, so any order is exact
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-8, 9, (4, 999), generator=g).float()
    w = torch.randint(-8, 9, (33, 999), generator=g).to(torch.bfloat16)
    assert torch.equal(host_gemv.bf16_linear(x, w), _ref(x, w).float())
    # the weight is used at full bf16 precision (not rounded further): 1 + 2^-7 survives
    w1 = torch.full((1, 64), 1 + 2 ** -7).to(torch.bfloat16)
    assert host_gemv.bf16_linear(torch.ones(1, 64), w1).item() == 64 * (1 + 2 ** -7)


def test_rows_and_threads_invariant():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 1024, generator=g).bfloat16().float()
    w = torch.randn(2048, 1024, generator=g).bfloat16()
    prev = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = host_gemv.bf16_linear(x, w)
        torch.set_num_threads(2)
        two = host_gemv.bf16_linear(x, w)
    finally:
        torch.set_num_threads(prev)
    assert torch.equal(one, two)
    for r in range(8):
        assert torch.equal(host_gemv.bf16_linear(x[r:r + 1], w)[0], one[r])
    assert torch.equal(host_gemv.bf16_linear(x[2:5], w), one[2:5])


def test_errors_name_the_operands():
    with pytest.raises(TypeError, match="w bf16"):
        host_gemv.bf16_linear(torch.zeros(1, 8), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="K"):
        host_gemv.bf16_linear(torch.zeros(1, 8), torch.zeros(4, 9, dtype=torch.bfloat16))


def test_bf16_operand_form_matches_fp32_operands():
    # OPERANDS.bf16 holds exactly the values OPERANDS.get gives the fp32 path (incl. the flush)
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 128, generator=g).bfloat16()
    w[0, :4] = torch.tensor([1e-39, -1e-39, 0.0, 1.0]).bfloat16()      # subnormals: flushed
    for prec, ts in (("bf16", (w,)), ("int8", quant.quantize_int8(w.float(), 32)),
                     ("int4", quant.quantize_int4(w.float(), 32))):
        got = OPERANDS.bf16(ts, prec, 32)
        assert got.dtype == torch.bfloat16
        assert torch.equal(got.float(), OPERANDS.get(ts, prec, 32)), prec
    OPERANDS.clear()


def test_int8_code_times_bf16_scale_is_not_always_bf16():
    """Why int8/int4 decode does not use torch's _weight_int8pack_mm: it scales the fp32 dot of
    the int8 codes by a per-channel scale, i.e. it uses code * scale unrounded, while the design
    rounds the dequantized weight to bf16 (and uses per-group scales). code * scale has up to
    7 + 8 significant bits, so it is not bf16 in general: 127 * (1 + 2^-7) needs 14."""
    code, scale = torch.tensor(127.0), torch.tensor(1 + 2 ** -7).bfloat16().float()
    exact = code * scale
    assert exact.item() == 127 + 127 / 128
    assert exact.bfloat16().float().item() != exact.item()


@pytest.fixture(scope="module", params=("qwen3", "llama", "gemma3"))
def tiny_model(request, tmp_path_factory):
    from llm_fixtures import build_model
    path = tmp_path_factory.mktemp(request.param)
    build_model(request.param, path)
    return request.param, path


PROMPT = [5, 17, 33, 101, 7, 250, 64, 12, 99, 3, 42, 77]


def _decode(path, precision: str, kernel: bool, monkeypatch) -> tuple[list[int], list]:
    from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
    monkeypatch.setattr(host_gemv, "MIN_WEIGHT", 0 if kernel else 1 << 62)
    eng = load_decoder(path, precision, max_context=96, prefill_chunk=8, quiet=True,
                       cache_dir=False)
    try:
        r = eng.complete(PROMPT, GenerationConfig(max_tokens=24, stop_token_ids=()))
        dec = eng.decoder
        dec.reset()
        logits = [dec.forward(PROMPT)] + [dec.forward([t]) for t in r.token_ids[:6]]
    finally:
        eng.close()
    return r.token_ids, logits


@pytest.mark.parametrize("precision", ["bf16", "int8", "int4"])
def test_engine_tokens_unchanged_by_the_kernel(tiny_model, precision, monkeypatch):
    fam, path = tiny_model
    base_toks, base_logits = _decode(path, precision, False, monkeypatch)
    toks, logits = _decode(path, precision, True, monkeypatch)
    assert toks == base_toks, f"{fam}/{precision}"
    for a, b in zip(logits, base_logits):
        # only the fp32 association differs; bf16 re-rounding of an intermediate may flip, so
        # bound by bf16 resolution of the logit scale rather than fp32's
        assert (a - b).abs().max().item() <= 2 ** -7 * b.abs().max().item(), f"{fam}/{precision}"


def test_kernel_rounds_x_like_numerics_operand():
    """bf16_linear rounds x to operands itself (the blocks skip a separate rounding pass): the
    same bits as rounding first, for random fp32 and edge values (bf16 ties, subnormals)."""
    from torch_xdna.kernels import numerics
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 1000, generator=g) * 3
    x[0, :6] = torch.tensor([1e-39, -1e-39, 1.00390625, 1.005859375, -1.0029296875, 3.3961e38])
    w = torch.randn(300, 1000, generator=g).bfloat16()
    for rows in (x[:1], x):                     # the single-row (paired) and the batch path
        assert torch.equal(host_gemv.bf16_linear(rows, w),
                           host_gemv.bf16_linear(numerics.operand(rows), w))
