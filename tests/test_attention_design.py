"""AttentionDesign against torch's scaled_dot_product_attention on CPU.

Tolerance: the design rounds Q, K, V and the softmax probabilities P to bf16 (fp32 accumulation
and softmax), so it matches fp32 SDPA on bf16-rounded inputs to about bf16 precision of P:
|err| <= 2e-2 * max|V| (P in [0, 1] has a relative bf16 error <= 2^-8 per term).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torch_xdna.hw import NPU4
from torch_xdna.kernels import numerics
from torch_xdna.kernels.ops.attention import AttentionDesign
from torch_xdna.runtime import Launch, TensorArg
from torch_xdna.runtime.sim import SimDevice


def _qkv(b, hq, hkv, lq, s, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, lq, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
            torch.randn(b, hkv, s, d, generator=g))


def _sdpa(q, k, v, **kw):
    r = numerics.bf16_round
    return F.scaled_dot_product_attention(r(q), r(k), r(v), **kw)


def _run(design, *inputs, **scalars):
    b, hq, lq, d = inputs[0].shape
    out = torch.empty(b, hq, lq, d)
    design.reference(list(inputs), [out], **scalars)
    return out


def _close(got, want, v):
    tol = 2e-2 * float(v.abs().max())
    assert (got - want).abs().max().item() <= tol


@pytest.mark.parametrize("b,hq,hkv,lq,s,d", [(1, 4, 4, 16, 16, 32), (2, 8, 2, 7, 23, 64),
                                             (1, 6, 3, 1, 40, 128)])
def test_matches_sdpa_plain_and_gqa(b, hq, hkv, lq, s, d):
    q, k, v = _qkv(b, hq, hkv, lq, s, d)
    got = _run(AttentionDesign(b, hq, hkv, lq, s, d), q, k, v)
    want = _sdpa(q, k, v, enable_gqa=hq != hkv)
    _close(got, want, v)


def test_causal_prefill_matches_sdpa_is_causal():
    q, k, v = _qkv(1, 4, 2, 33, 33, 64, seed=1)
    got = _run(AttentionDesign(1, 4, 2, 33, 33, 64, causal=True), q, k, v)
    _close(got, _sdpa(q, k, v, is_causal=True, enable_gqa=True), v)


def test_additive_mask_and_scale():
    q, k, v = _qkv(2, 4, 4, 9, 12, 32, seed=2)
    g = torch.Generator().manual_seed(3)
    mask = torch.randn(2, 1, 1, 12, generator=g)
    mask[1, ..., :5] = float("-inf")                     # padding of the second sequence
    d = AttentionDesign(2, 4, 4, 9, 12, 32, mask=True, mask_shape=(2, 1, 1, 12), scale=0.3)
    got = _run(d, q, k, v, mask)
    _close(got, _sdpa(q, k, v, attn_mask=mask, scale=0.3), v)
    assert d.softmax_scale == 0.3
    assert AttentionDesign(1, 1, 1, 1, 1, 64).softmax_scale == pytest.approx(1 / math.sqrt(64))


def test_kv_length_scalar_over_a_cache_capacity():
    """One design of capacity 64 serves a cache holding 20 valid keys; the new queries are the
    newest tokens (bottom-right causal alignment, as a KV cache needs)."""
    cap, valid, lq = 64, 20, 4
    q, k, v = _qkv(1, 8, 2, lq, cap, 64, seed=4)
    k[..., valid:, :] = 1e4                               # garbage beyond the valid length
    v[..., valid:, :] = float("nan")
    d = AttentionDesign(1, 8, 2, lq, cap, 64, causal=True)
    got = _run(d, q, k, v, kv_len=valid)
    qpos = torch.arange(lq).unsqueeze(1) + valid - lq
    allowed = torch.arange(valid).unsqueeze(0) <= qpos
    want = _sdpa(q, k[..., :valid, :], v[..., :valid, :], attn_mask=allowed, enable_gqa=True)
    assert torch.isfinite(got).all()
    _close(got, want, v[..., :valid, :])
    with pytest.raises(ValueError, match="kv_len"):
        _run(d, q, k, v, kv_len=cap + 1)


def test_bf16_numerics_are_the_npu_policy():
    """Same result as an explicit emulation of the flash order (one key tile here): bf16
    operands, fp32 scores, P = bf16(exp(s - max)), fp32 P@V and row sum, divided at the end."""
    q, k, v = _qkv(1, 2, 2, 5, 8, 16, seed=5)
    r = numerics.bf16_round
    s = r(q) @ r(k).transpose(-1, -2) / 4.0
    p = r(torch.exp(s - s.amax(-1, keepdim=True)))
    want = (p @ r(v)) / p.sum(-1, keepdim=True)
    torch.testing.assert_close(_run(AttentionDesign(1, 2, 2, 5, 8, 16), q, k, v), want,
                               rtol=1e-6, atol=1e-6)


def test_one_launch_on_the_simulator_with_strided_views():
    """q/k/v as head-transposed views of [B, L, H, D] buffers, run as one launch."""
    b, hq, hkv, lq, d = 1, 4, 2, 6, 32
    q, k, v = _qkv(b, hq, hkv, lq, lq, d, seed=6)
    dev = SimDevice(NPU4, 1 << 26)

    def blhd(t):                                          # upload as [B, L, H, D], view [B,H,L,D]
        a = dev.upload(t.transpose(1, 2).contiguous())
        bb, ll, hh, dd = a.shape
        return TensorArg(a.buffer, a.dtype, (bb, hh, ll, dd), (ll * hh * dd, dd, hh * dd, 1))

    out = dev.empty((b, hq, lq, d), torch.float32)
    design = AttentionDesign(b, hq, hkv, lq, lq, d, causal=True)
    dev.trace = []
    dev.run(Launch(design, [blhd(q), blhd(k), blhd(v)], [out], op="attn"))
    got = dev.download(out)
    _close(got, _sdpa(q, k, v, is_causal=True, enable_gqa=True), v)
    assert dev.counters.launches == 1 and len(dev.trace) == 1
    assert dev.trace[0].design == "attention+causal+gqa"


def test_design_validates_heads():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        AttentionDesign(1, 6, 4, 1, 8, 64)


def _sdpa_npu_policy(q, k, v, **kw):
    """torch SDPA with the design's flash rounding (one key tile here): SDPA of V = identity
    gives torch's own probabilities (its mask and causal semantics); P = bf16(p / max p) is
    exp(s - max s) rounded, then P @ V / sum P."""
    eye = torch.eye(k.shape[-2]).expand(*k.shape[:2], -1, -1)
    p = F.scaled_dot_product_attention(q, k, eye, enable_gqa=True, **kw)
    p = numerics.bf16_round(p / p.amax(-1, keepdim=True))
    return (p @ v.repeat_interleave(q.shape[1] // v.shape[1], 1)) / p.sum(-1, keepdim=True)


def test_bool_mask_and_top_left_causal_match_torch_sdpa():
    """The compiler's case: a boolean mask (True = attend) and torch's is_causal, which is
    top-left aligned (query i sees keys 0..i), not the KV-cache bottom-right default."""
    b, hq, hkv, lq, s, d = 1, 4, 2, 3, 7, 16
    q, k, v = (numerics.bf16_round(t) for t in _qkv(b, hq, hkv, lq, s, d, seed=7))
    keep = torch.rand(b, 1, lq, s, generator=torch.Generator().manual_seed(8)) > 0.3
    keep[..., 0] = True                                   # no fully-masked row (torch gives NaN)
    masked = dict(mask=True, mask_shape=tuple(keep.shape), mask_bool=True)
    cases = [(AttentionDesign(b, hq, hkv, lq, s, d, **masked), (keep,), dict(attn_mask=keep)),
             (AttentionDesign(b, hq, hkv, lq, s, d, causal=True, top_left=True), (),
              dict(is_causal=True)),
             (AttentionDesign(b, hq, hkv, lq, s, d, causal=True, top_left=True, **masked), (keep,),
              dict(attn_mask=keep & torch.ones(lq, s, dtype=torch.bool).tril()))]
    for design, extra, kw in cases:
        got = _run(design, q, k, v, *extra)
        torch.testing.assert_close(got, _sdpa_npu_policy(q, k, v, **kw), rtol=0, atol=1e-5)
        _close(got, F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw), v)
    top = cases[1][0]
    # top_left is the same as the launch scalar q_offset=0; the default (bottom-right) differs
    base = AttentionDesign(b, hq, hkv, lq, s, d, causal=True)
    assert torch.equal(_run(top, q, k, v), _run(base, q, k, v, q_offset=0))
    assert (_run(base, q, k, v) - _run(top, q, k, v)).abs().max() > 1e-2
    # the plan reads a bool mask at 1 byte per element (additive: 4)
    additive = AttentionDesign(b, hq, hkv, lq, s, d, mask=True, mask_shape=tuple(keep.shape))
    # the mask is streamed once at its own (broadcast) shape: 1 byte vs 4 per element
    assert additive.plan(NPU4).dram_read_bytes - cases[0][0].plan(NPU4).dram_read_bytes == \
        keep.numel() * 3
