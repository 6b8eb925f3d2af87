"""Flash (online-softmax) attention of the LLM attention block against torch SDPA, and its plans
at long contexts.

Reference: torch.nn.functional.scaled_dot_product_attention on the bf16-rounded q/k/v with the
causal (+ sliding window) boolean mask. Tolerance: the kernel rounds P = exp(S - m_running) to
bf16 (relative error <= 2^-8 per term), so |err| <= 2e-2 * max|V|; in the fp32 verification mode
(exact=True, nothing rounded) 2e-5. KV lengths 1, 127, 4097, 8193, 33000 (partial tiles, more
tiles than one split, > 32K keys); tiny heads and head_dim keep it fast.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_xdna.hw import NPU4
from torch_xdna.kernels import numerics
from torch_xdna.kernels.ops.attention import (
    decode_splits, flash_attention, flash_attention_loop, kv_tile_for, split_ranges,
)
from torch_xdna.kernels.blocks.llm import AttentionBlockDesign
from torch_xdna.kernels.blocks.toolkit import attend
from torch_xdna.models.families import BUILTIN_CONFIGS, spec_from_config

HQ, HKV, D = 4, 2, 8
LENGTHS = (1, 127, 4097, 8193, 33000)


def _case(s_len: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + s_len)
    q = torch.randn(HQ, n, D, generator=g) * 2
    k = numerics.operand(torch.randn(HKV, s_len, D, generator=g) * 2)
    v = numerics.operand(torch.randn(HKV, s_len, D, generator=g))
    return q, k, v


def _sdpa(q, k, v, q_offset: int, window: int | None, exact: bool):
    rq = q if exact else numerics.operand(q)
    n, s_len = q.shape[1], k.shape[1]
    qpos = torch.arange(n).unsqueeze(1) + q_offset
    kpos = torch.arange(s_len).unsqueeze(0)
    keep = kpos <= qpos
    if window:
        keep &= kpos > qpos - window
    return F.scaled_dot_product_attention(rq.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                          attn_mask=keep, scale=D ** -0.5, enable_gqa=True)[0]


@pytest.mark.parametrize("s_len", LENGTHS)
@pytest.mark.parametrize("phase", ("decode", "prefill"))
@pytest.mark.parametrize("window", (None, 100))
def test_flash_matches_sdpa(s_len, phase, window):
    n = 1 if phase == "decode" or s_len < 5 else 5
    q, k, v = _case(s_len, n)
    offset = s_len - n                         # the queries are the newest tokens
    splits = decode_splits(HKV, 1) if phase == "decode" else 1
    got = attend(q, k, v, scale=D ** -0.5, q_offset=offset, window=window, softcap=None,
                 exact=False, tkv=64, splits=splits)
    want = _sdpa(q, k, v, offset, window, exact=False)
    assert (got - want).abs().max().item() <= 2e-2 * float(v.abs().max()), (s_len, phase, window)
    exact = attend(q, k, v, scale=D ** -0.5, q_offset=offset, window=window, softcap=None,
                   exact=True, tkv=64, splits=splits)
    torch.testing.assert_close(exact, _sdpa(q, k, v, offset, window, exact=True),
                               atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("s_len,splits,k_offset", [(2049, 16, 0), (1000, 4, 37), (127, 1, 5)])
def test_closed_form_is_the_tile_loop(s_len, splits, k_offset):
    """flash_attention (closed form) = flash_attention_loop (the kernel's order) to fp32
    round-off, including split-KV reduction and a key slice starting mid-tile."""
    q, k, v = _case(s_len, 3, seed=1)
    qg = q.reshape(HKV, -1, D)
    qpos = (torch.arange(3) + k_offset + s_len - 3).repeat(HQ // HKV)
    kw = dict(scale=D ** -0.5, tkv=32, splits=splits, q_offset=qpos, k_offset=k_offset, window=300)
    torch.testing.assert_close(flash_attention(qg, k, v, **kw), flash_attention_loop(qg, k, v, **kw),
                               atol=1e-6, rtol=1e-5)


def test_split_ranges_and_tile_sizes():
    assert split_ranges(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert split_ranges(1, 8) == [(0, 1)]
    # double-buffered bf16 K and V tiles take at most 60% of a core's L1
    assert (kv_tile_for(64), kv_tile_for(128), kv_tile_for(256)) == (64, 32, 16)
    assert decode_splits(8, 1) == 4 and decode_splits(1, 1) == 32 and decode_splits(32, 2) == 1


@pytest.mark.parametrize("name", ("qwen3-0.6b", "llama-3.2-1b", "gemma-3-1b"))
def test_attention_block_plans_at_every_context(name):
    """The fused attention block plans at every KV extent up to 128K (decode and a 128-row
    prefill chunk): no score row in L1; KV bytes grow linearly with the extent."""
    spec = spec_from_config(BUILTIN_CONFIGS[name])
    cap = 131072
    for rows in (1, 128):
        d = AttentionBlockDesign(spec.hidden, rows, "int4", 32, spec.rms_eps, spec.norm_offset,
                                 spec.heads, spec.kv_heads, spec.head_dim, cap,
                                 qk_norm=spec.qk_norm, scale=spec.attn_scale)
        full = d.plan(NPU4)
        assert full.l1_bytes <= NPU4.l1_usable
        kv = [d.launch_plan(NPU4, pos=p - rows, n=rows).notes["kv_read_bytes"]
              for p in (1024, 8192, 32768, 131072)]
        per_key = 2 * spec.kv_heads * spec.head_dim * 2
        assert kv == [per_key * p for p in (1024, 8192, 32768, 131072)]
        if rows == 1:                           # decode: the cache is split over the cores
            assert full.notes["kv_splits"] == decode_splits(spec.kv_heads, 1) > 1
            # the array IR lowering (stage by stage) also holds at 128K: one attention stage
            from torch_xdna.array.validate import validate
            from torch_xdna.kernels.lower import lower
            progs = lower(d, NPU4)
            assert "llm_attention.attention" in [dict(p.notes)["stage"] for p in progs]
            for p in progs:
                validate(p, NPU4)
