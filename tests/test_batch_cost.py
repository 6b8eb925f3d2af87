"""Modeled batched decode (plans only, Qwen3-0.6B shapes at a 1k context): a step costs more
with more sequences, tok/s rises with the batch, and each added sequence adds its own attention
work (the batch-1 split-KV kernel over its own cache), not a causal block of N queries."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_serving import modeled_batching  # noqa: E402
from torch_xdna.engine.llm.batching import batch_step_designs  # noqa: E402
from torch_xdna.engine.llm.decoder import PrecisionPolicy  # noqa: E402
from torch_xdna.engine.llm.estimate import resolve_spec  # noqa: E402
from torch_xdna.hw import get_generation  # noqa: E402
from torch_xdna.kernels.ops.attention import AttentionDesign  # noqa: E402
from torch_xdna.kernels.ops.gemm import GemmDesign  # noqa: E402
from torch_xdna.kernels.blocks.llm_batch import BatchedLayerDesign  # noqa: E402

SIZES = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def rows():
    return modeled_batching(sizes=SIZES)


@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_step_time_monotone_and_tok_s_rises_with_batch(rows, precision):
    r = [x for x in rows if x["precision"] == precision]
    assert [x["sequences"] for x in r] == list(SIZES)
    steps = [x["step_ms_modeled"] for x in r]
    tok_s = [x["device_tok_s_modeled"] for x in r]
    assert steps == sorted(steps), steps
    assert all(a < b for a, b in zip(tok_s, tok_s[1:])), tok_s


def _layer(precision: str, n: int) -> BatchedLayerDesign:
    _, spec = resolve_spec("qwen3-0.6b")
    designs = batch_step_designs(spec, PrecisionPolicy.parse(precision, 0), n, 8, 2048)
    return next(d for d in designs if isinstance(d, BatchedLayerDesign))


@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_second_sequence_adds_one_sequences_attention(precision):
    """Batch 1 fills the 32 cores with 8 KV heads x 4 splits; a second sequence doubles the
    work items, so the layer's compute grows by one batch-1 attention (its KV tile passes),
    while the batch-2 GEMMs run the batch-1 tiles (4-row M tile)."""
    gen = get_generation("npu4")
    one, two = (_layer(precision, n).launch_plan(gen, n=n, pos=(1023,) * n) for n in (1, 2))
    a = _layer(precision, 1).layer.attention
    attn = AttentionDesign(1, a.heads, a.kv_heads, 1, 1024, a.head_dim, causal=True,
                           kv_tile=a.tkv, splits=a.splits).plan(gen)
    assert attn.notes["work_items"] == gen.cores
    grew = two.compute_cycles - one.compute_cycles
    assert grew == pytest.approx(attn.compute_cycles, rel=0.1)


@pytest.mark.parametrize("dtype,group", [("bf16", 0), ("int4", 32)])
def test_decode_rows_stream_the_weights_once(dtype, group):
    """Up to 8 decode rows fit one L2 block: the weights leave DRAM once, at the single-pass
    stream rate, so 8 rows never model cheaper than 4 by splitting M into two tiles."""
    gen = get_generation("npu4")
    steady = []
    for m in SIZES:
        p = GemmDesign(m, 1024, 6144, dtype=dtype, w_group=group).plan(gen)
        assert p.notes["stream_bytes"] == p.notes["weight_read_bytes"]
        steady.append(p.notes["steady_state_s"])
    assert steady == sorted(steady), steady
