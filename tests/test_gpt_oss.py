"""gpt-oss on the decoder engine (simulator): tokens against transformers 5.25's GptOss.

Two random-weight directories built here (nothing downloads): a GptOssForCausalLM from a small
GptOssConfig saved with save_pretrained (fp32 experts, stacked [E, H, 2I] with interleaved
gate/up columns), and a copy whose expert tensors are converted to MXFP4 `*_blocks` / `*_scales`
in the checkpoint layout (our round-to-nearest E2M1 codes, power-of-two E8M0 scales) with
quantization_config {"quant_method": "mxfp4"}; transformers' own loader dequantizes that copy
(Mxfp4Config(dequantize=True)), so the reference runs on exactly the values the MXFP4 files hold.
The small config exercises every gpt-oss feature: attention sinks (non-zero), q/k/v/o biases,
sliding window 8 alternating with full attention under a 20-token prompt, YaRN RoPE, a biased
router with softmax over the top-2 logits, biased experts, and the clamped SwiGLU (limit 0.75,
so the clamps bite at these weight scales; gpt-oss-20b uses 7.0).
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from llm_fixtures import (
    batched_and_alone, build_model, check_against_transformers, copy_without, decode_charged,
    hf_greedy, prefill_hits,
)
from torch_xdna.engine.llm.decoder import PrecisionPolicy, resident_bytes_estimate
from torch_xdna.engine.llm.estimate import estimate, resolve_spec
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.kernels import quant
from torch_xdna.kernels.blocks.weights import dequantize, weight_bytes

PROMPT = [(7 * i + 3) % 380 + 5 for i in range(20)]     # longer than the sliding window (8)
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(fp32 dir, its HF model, MXFP4 dir, transformers' model loaded from the MXFP4 dir)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, Mxfp4Config
    base = tmp_path_factory.mktemp("gpt_oss")
    src, mx = base / "fp32", base / "mxfp4"
    hf = build_model("gpt_oss", src)
    shutil.copytree(src, mx)
    sd = load_file(str(src / "model.safetensors"))
    for name in [n for n in sd if n.endswith(EXPERTS)]:
        w = sd.pop(name).float().transpose(1, 2).contiguous()      # [E, N, K], K blocked
        blocks, scales = quant.encode_mxfp4(w)
        sd[name + "_blocks"] = blocks.reshape(*scales.shape, 16)   # [E, N, K/32, 16] uint8
        sd[name + "_scales"] = scales                              # [E, N, K/32] uint8 (E8M0)
    save_file(sd, str(mx / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((mx / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (mx / "config.json").write_text(json.dumps(cfg))
    hf_mx = AutoModelForCausalLM.from_pretrained(
        mx, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32,
        attn_implementation="eager").eval()
    return src, hf, mx, hf_mx


def _engine(path, precision, chunk=8):
    return load_decoder(path, precision, max_context=96, prefill_chunk=chunk, quiet=True,
                        cache_dir=False)


def test_fp32_greedy_tokens_identical_to_transformers(dirs):
    """fp32 verification mode, 20-token prompt in chunks of 8 (sliding window 8), then 32
    greedy tokens: identical to transformers; teacher-forced logits within 1e-4."""
    src, hf, _, _ = dirs
    eng = _engine(src, "fp32")
    s = eng.spec
    assert (s.family, s.experts, s.experts_per_token, s.layer_window) == (
        "gpt_oss", 8, 2, (8, None, 8, None))
    assert s.attention_sinks and s.attention_bias and s.router_topk_first and s.swiglu_limit == 0.75
    assert s.params() == sum(p.numel() for n, p in hf.named_parameters()
                             if "norm" not in n and "bias" not in n and "sinks" not in n)
    r = eng.complete(PROMPT, GenerationConfig(max_tokens=32, stop_token_ids=()))
    assert r.token_ids == hf_greedy(hf, PROMPT, 32)
    check_against_transformers(eng, hf, PROMPT, None)
    eng.close()


def test_mxfp4_dir_experts_stay_mxfp4_and_tokens_identical(dirs):
    """The MXFP4 directory: experts resident as MXFP4 codes + E8M0 scales (4.25 bits per
    weight), the checkpoint's own bytes (rows reordered gate | up), decoding to exactly
    transformers' dequantized values; fp32 verification numerics
    around them: 32 greedy tokens identical to transformers run on the dequantized weights."""
    _, _, mx, hf_mx = dirs
    eng = _engine(mx, {"default": "fp32", "mlp": "mxfp4"})
    dec, s = eng.decoder, eng.spec
    e, f, h = s.experts, s.expert_intermediate, s.hidden
    codes, scales = dec.w["layers.1.experts_gate_up"]
    assert codes.dtype == scales.dtype == torch.uint8
    assert tuple(codes.shape) == (e * 2 * f, h // 2) and tuple(scales.shape) == (e * 2 * f, h // 32)
    ref = hf_mx.model.layers[1].mlp.experts.gate_up_proj.detach().transpose(1, 2)   # [E, 2I, H]
    ref = torch.cat([ref[:, 0::2], ref[:, 1::2]], dim=1).reshape(e * 2 * f, h)       # gate | up
    host = [dec.dev.download(t) for t in (codes, scales)]
    assert torch.equal(dequantize(host, "mxfp4"), ref)
    from safetensors.torch import load_file                  # the checkpoint's bytes, kept
    sd = load_file(str(mx / "model.safetensors"))
    name = "model.layers.1.mlp.experts.gate_up_proj"
    for got, t in zip(host, (sd[name + "_blocks"].flatten(-2), sd[name + "_scales"])):
        assert torch.equal(got, torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).flatten(0, 1))
    r = eng.complete(PROMPT, GenerationConfig(max_tokens=32, stop_token_ids=()))
    assert r.token_ids == hf_greedy(hf_mx, PROMPT, 32)
    eng.close()


def test_mxfp4_npu_numerics_and_bytes_charged(dirs):
    """bf16 operands with MXFP4 experts (the NPU's numerics): logits near transformers' fp32
    ones, the resident bytes as estimated from shapes, and a decode token is charged the router plus exactly 2 experts per layer at
    4.25 bits per weight (+ their bf16 biases), as the estimate from shapes says."""
    _, _, mx, hf_mx = dirs
    eng = _engine(mx, {"default": "bf16", "mlp": "mxfp4"})
    check_against_transformers(eng, hf_mx, PROMPT, 0.05)
    s, dec = eng.spec, eng.decoder
    # the memory check's estimate from shapes counts every resident byte (MXFP4 experts, biases,
    # sinks), so a model that passes it fits
    assert resident_bytes_estimate(s, dec.policy, dec.capacity, dec.chunk) == dec.resident_bytes
    got, want = decode_charged(eng, PROMPT)
    assert got == want["dram_bytes"]
    f, h = s.expert_intermediate, s.hidden
    per_expert = 3 * f * h * 4.25 / 8 + (2 * f + h) * 2
    assert want["expert_bytes"] == s.layers * s.experts_per_token * per_expert
    eng.close()


def test_grouped_prefill_charges_the_experts_transformers_routes_to(dirs, monkeypatch):
    """A 16-row prefill chunk runs each expert its rows chose once (grouped) and is charged
    exactly those experts per layer: transformers' router picks for the same rows."""
    src, hf, _, _ = dirs
    eng = _engine(src, "fp32", chunk=16)
    charged, want = prefill_hits(monkeypatch, eng, hf, PROMPT[:16])
    assert [h for _, h in charged] == want and all(n == 16 for n, _ in charged)
    assert len(want) == 4 and all(2 <= h <= 8 for h in want)
    eng.close()


def test_attention_sinks_in_the_flash_kernel():
    """Sinks as the running max's start: the closed form, the tile loop and softmax over
    [scores, sink] (the sink's column dropped) agree, with sliding windows and split-KV."""
    from torch_xdna.kernels.ops.attention import flash_attention, flash_attention_loop
    torch.manual_seed(0)
    hkv, r, d, n = 2, 3, 16, 40
    q, k, v = torch.randn(hkv, r, d), torch.randn(hkv, n, d), torch.randn(hkv, n, d)
    sinks = torch.randn(hkv, r) * 2
    pos = torch.arange(n - r, n)
    for window in (None, 10):
        s = (q @ k.transpose(1, 2)) * 0.25
        hidden = torch.arange(n)[None] > pos[:, None]
        if window:
            hidden |= torch.arange(n)[None] <= pos[:, None] - window
        p = torch.softmax(torch.cat([s.masked_fill(hidden, float("-inf")), sinks[..., None]], -1), -1)
        want = p[..., :-1] @ v
        for splits in (1, 3):
            kw = dict(scale=0.25, tkv=16, splits=splits, causal=True, q_offset=pos, exact=True,
                      window=window, sinks=sinks)
            got = flash_attention(q, k, v, **kw)
            assert (got - want).abs().max() < 1e-6
            kw["q_offset"] = n - r               # the loop takes one position: check rows alike
            one = flash_attention(q, k, v, **kw)
            assert (flash_attention_loop(q, k, v, **kw) - one).abs().max() < 1e-6


def test_mxfp4_format_matches_transformers():
    """Our encoder: round to nearest E2M1 (ties to even codes), the smallest power-of-two
    scale; decoding equals transformers' convert_moe_packed_tensors; re-encoding a decoded
    block is lossless (so a checkpoint's MXFP4 values stay exactly those values)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    torch.manual_seed(1)
    w = torch.randn(3, 8, 64) * torch.logspace(-3, 1, 8).view(1, 8, 1)
    blocks, scales = quant.encode_mxfp4(w)
    got = quant.decode_mxfp4(blocks, scales)
    ref = convert_moe_packed_tensors(blocks.reshape(*scales.shape, 16), scales, dtype=torch.float32)
    assert torch.equal(ref.transpose(1, 2), got)
    assert torch.equal(quant.decode_mxfp4(*quant.encode_mxfp4(got)), got)
    err = (got - w).abs() / w.abs().reshape(3, 8, 2, 32).amax(-1).repeat_interleave(32, -1)
    # at most half the widest step (4 -> 6) of a block scaled to max|w| in (3, 6]: < 1/3 of it
    assert err.max() < 1 / 3
    ties = torch.tensor([[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.75] + [0.0] * 23])
    assert quant.decode_mxfp4(*quant.encode_mxfp4(ties))[0, :9].tolist() == [
        0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0]
    assert weight_bytes(2880, 2880, "mxfp4") * 8 / (2880 * 2880) == 4.25


def test_gpt_oss_20b_estimate_mxfp4_and_int4():
    """Modeled (cost model) from gpt-oss-20b's config: 20.9B parameters, 4 of 32 experts per
    layer streamed per token; MXFP4 experts charged 4.25 bits per weight, int4 g32 4.5."""
    _, spec = resolve_spec("gpt-oss-20b")
    assert 20.5e9 < spec.params() < 21.5e9 and spec.experts == 32 and spec.experts_per_token == 4
    assert spec.layer_window[:2] == (128, None) and spec.ropes["global"].type == "yarn"
    f = h = 2880
    for precision, bits in (("mxfp4", 4.25), ("int4", 4.5)):
        rows = [estimate(spec, precision, c) for c in (1024, 4096, 32768)]
        per_expert = 3 * f * h * bits / 8 + (2 * f + h) * 2
        for r in rows:
            assert r["expert_mb_per_token"] * 1e6 == pytest.approx(24 * 4 * per_expert)
        assert rows[0]["modeled_decode_tok_s"] > rows[2]["modeled_decode_tok_s"]
    assert (estimate(spec, "mxfp4", 1024)["mb_per_token"]
            < estimate(spec, "int4", 1024)["mb_per_token"])


def test_policy_rules():
    """fp32 verification mixes only with mxfp4 (exactly decoded) MLP weights."""
    assert PrecisionPolicy.parse({"default": "fp32", "mlp": "mxfp4"}).exact
    with pytest.raises(ValueError, match="fp32"):
        PrecisionPolicy.parse({"default": "fp32", "mlp": "int4"})
    with pytest.raises(ValueError, match="fp32"):
        PrecisionPolicy.parse({"default": "bf16", "mlp": "fp32"})
    with pytest.raises(ValueError, match="fp32"):
        PrecisionPolicy.parse({"default": "fp32", "head": "mxfp4"})


def test_batched_decode_equals_alone(dirs):
    """Concurrent sequences in one batch session (the server's path): each sequence's tokens
    equal its one-at-a-time tokens (bf16 operands, MXFP4 experts)."""
    _, _, mx, _ = dirs
    eng = load_decoder(mx, {"default": "bf16", "mlp": "mxfp4"}, max_context=96, quiet=True,
                       cache_dir=False, prefix_cache=0)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(5, 390, (n,), generator=g).tolist() for n in (7, 19, 12)]
    cfg = GenerationConfig(max_tokens=6, stop_token_ids=())
    batched, alone = batched_and_alone(eng, prompts, cfg)
    assert batched == alone
    eng.close()


def test_native_precision_keeps_the_checkpoints_mxfp4_experts(dirs):
    """precision 'native' (the CLI's default) of an MXFP4 checkpoint: bf16 elsewhere, the
    experts MXFP4 as stored."""
    _, _, mx, _ = dirs
    eng = load_decoder(mx, quiet=True, max_context=32, cache_dir=False)
    p = eng.decoder.policy
    assert (p.attention, p.mlp, p.head) == ("bf16", "mxfp4", "bf16")
    assert eng.decoder.w["layers.0.experts_down"][0].dtype == torch.uint8
    eng.close()


def test_refusals_named(dirs, tmp_path):
    """Another quantization method is refused by name; an MXFP4 checkpoint missing a scales
    tensor is refused naming it, before any weight is read."""
    from torch_xdna.models.hf import ModelDirError
    from torch_xdna.models.spec import UnsupportedModelError
    _, _, mx, _ = dirs
    d = tmp_path / "gptq"
    shutil.copytree(mx, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(UnsupportedModelError, match="gptq"):
        load_decoder(d, quiet=True)
    d = copy_without(mx, tmp_path / "noscales", "model.layers.2.mlp.experts.down_proj_scales")
    with pytest.raises(ModelDirError, match=r"layers\.2\.mlp\.experts\.down_proj_scales"):
        load_decoder(d, quiet=True)
