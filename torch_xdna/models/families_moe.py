"""gpt-oss (OpenAI) as data: config.json -> DecoderSpec, its weight names and their shapes.

What the family adds to the Qwen3-MoE decoder, as transformers 5.25's modeling_gpt_oss.py
defines it: q/k/v/o biases, a learned per-head logit in each softmax denominator (attention
sinks), alternating sliding-window / full-attention layers, YaRN RoPE, a router with a bias
whose softmax runs over the top-k logits, experts with biases and the clamped SwiGLU
((up + 1) * gate * sigmoid(1.702 gate), gate <= 7, |up| <= 7), all stacked in one tensor per
projection; checkpoints store the experts in MXFP4 (kernels/quant.py), config
quantization_config {"quant_method": "mxfp4"}. The experts are as wide as intermediate_size.
"""
from __future__ import annotations

from torch_xdna.models.family_parts import (
    LAYER, LLAMA_NAMES, base_spec, classic_rope, layer_types, moe_fields, refuse, rope_spec, windows,
)
from torch_xdna.models.spec import DecoderSpec, WeightNames

_A, _M = LAYER + "self_attn.", LAYER + "mlp."
GPT_OSS_NAMES = WeightNames(**{
    **LLAMA_NAMES.__dict__, "gate": "", "up": "", "down": "",
    **{f"{p}_bias": f"{_A}{p}_proj.bias" for p in "qkvo"},
    "sinks": _A + "sinks", "router": _M + "router.weight", "router_bias": _M + "router.bias",
    "experts_gate_up": _M + "experts.gate_up_proj",
    "experts_gate_up_bias": _M + "experts.gate_up_proj_bias",
    "experts_down": _M + "experts.down_proj", "experts_down_bias": _M + "experts.down_proj_bias"})
MXFP4_SUFFIXES = ("_blocks", "_scales")


def gpt_oss(cfg: dict) -> DecoderSpec:
    """gpt-oss: every layer MoE (module docstring); the only quantization_config accepted is
    the checkpoint's own MXFP4 experts (the loader decodes them exactly)."""
    family = "gpt_oss"
    q = cfg.get("quantization_config")
    if q and q.get("quant_method") != "mxfp4":
        refuse(family, f"quantization_config ({q.get('quant_method', '?')})",
               "gpt-oss checkpoints with MXFP4 experts, or bf16/fp32 ones, load")
    if cfg.get("hidden_act", "silu") != "silu":
        refuse(family, f"hidden_act={cfg['hidden_act']!r}", "the clamped SwiGLU (silu) only")
    layers = int(cfg["num_hidden_layers"])
    types = layer_types(cfg, layers)
    moe = moe_fields(family, {**cfg, "moe_intermediate_size": cfg.get("intermediate_size")})
    mp = int(cfg.get("max_position_embeddings", 0))
    bias = bool(cfg.get("attention_bias", True))
    return base_spec(
        family, cfg, GPT_OSS_NAMES if bias else WeightNames(**{
            **GPT_OSS_NAMES.__dict__, **{f"{p}_bias": "" for p in "qkvo"}}),
        ropes={"global": rope_spec(family, classic_rope(cfg), 150000.0, mp)},
        layer_rope=("global",) * layers, layer_window=windows(family, cfg, types),
        **{**moe, "norm_topk_prob": True}, attention_bias=bias, attention_sinks=True,
        router_bias=True, router_topk_first=True, expert_bias=True,
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)))


def fused_expert_shapes(spec: DecoderSpec, have: set[str]) -> dict[str, tuple[tuple[int, ...], str]]:
    """gpt-oss's per-layer tensors beyond the dense ones (HF name -> (shape, why)): sinks,
    router and its bias, the stacked experts (dense or MXFP4 blocks + scales, whichever the
    checkpoint `have`s) and their biases."""
    n, h, e, f = spec.names, spec.hidden, spec.experts, spec.expert_intermediate
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for i in range(spec.layers):
        out[n.sinks.format(i=i)] = ((spec.heads,), "num_attention_heads")
        out[n.router.format(i=i)] = ((e, h), "num_local_experts x hidden_size")
        out[n.router_bias.format(i=i)] = ((e,), "num_local_experts")
        for name, (rows, k), why in ((n.experts_gate_up, (2 * f, h), "2 intermediate x hidden"),
                                     (n.experts_down, (h, f), "hidden x intermediate")):
            base = name.format(i=i)
            if base + "_blocks" in have:
                out[base + "_blocks"] = ((e, rows, k // 32, 16), f"experts x {why} (MXFP4 codes)")
                out[base + "_scales"] = ((e, rows, k // 32), f"experts x {why} (MXFP4 scales)")
            else:
                out[base] = ((e, k, rows), f"experts x {why}, transposed")
            out[base + "_bias"] = ((e, rows), f"experts x {why.split(' x ')[0]}")
    return out
