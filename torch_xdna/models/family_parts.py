"""The config -> DecoderSpec rules every decoder family shares (models/families.py builds the
families from them; models/families_moe.py the mixture-of-experts ones): refusals by name,
activations, RoPE parameters, the common spec fields, layer types and sliding windows, the
mixture-of-experts fields.
"""
from __future__ import annotations

import math

from torch_xdna.models.spec import DecoderSpec, RopeSpec, UnsupportedModelError, WeightNames

# the mixture-of-experts families (named in the refusal of a MoE config by a dense family)
MOE_FAMILIES = ("qwen3_moe", "gpt_oss")

ROPE_TYPES = ("default", "linear", "llama3", "freq_factors", "yarn", "proportional")
ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh",
        "relu": "relu"}

LAYER = "model.layers.{i}."
LLAMA_NAMES = WeightNames(
    embed="model.embed_tokens.weight", final_norm="model.norm.weight", lm_head="lm_head.weight",
    attn_norm=LAYER + "input_layernorm.weight", q=LAYER + "self_attn.q_proj.weight",
    k=LAYER + "self_attn.k_proj.weight", v=LAYER + "self_attn.v_proj.weight",
    o=LAYER + "self_attn.o_proj.weight", mlp_norm=LAYER + "post_attention_layernorm.weight",
    gate=LAYER + "mlp.gate_proj.weight", up=LAYER + "mlp.up_proj.weight",
    down=LAYER + "mlp.down_proj.weight")

def refuse(family: str, feature: str, hint: str = "") -> None:
    raise UnsupportedModelError(
        f"{family}: config feature {feature} is not supported by the xdna decode engine"
        + (f"; {hint}" if hint else ""))


MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def common_checks(family: str, cfg: dict, moe: bool = False) -> None:
    for key in (() if moe else MOE_KEYS):
        if cfg.get(key):
            refuse(family, f"{key}={cfg[key]} (mixture of experts)",
                    "mixture-of-experts families: " + ", ".join(MOE_FAMILIES))
    for key in ("shared_expert_intermediate_size", "n_shared_experts"):
        if cfg.get(key):
            refuse(family, f"{key}={cfg[key]} (shared experts)", "not implemented")
    if cfg.get("attention_bias"):
        refuse(family, "attention_bias=true", "q/k/v/o projection biases are not implemented")
    if cfg.get("mlp_bias"):
        refuse(family, "mlp_bias=true", "MLP biases are not implemented")
    if cfg.get("quantization_config"):
        method = cfg["quantization_config"].get("quant_method", "?")
        refuse(family, f"quantization_config ({method})",
                "load the original bf16/fp32 checkpoint and pass --precision int8|int4|bfp16")
    if cfg.get("attention_dropout") not in (None, 0, 0.0):
        pass                                  # dropout is inactive at inference


def act(family: str, cfg: dict) -> str:
    name = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if name not in ACTS:
        refuse(family, f"hidden_act={name!r}", f"supported: {', '.join(ACTS)}")
    return ACTS[name]


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_spec(family: str, params: dict | None, theta_default: float,
          max_positions: int = 0) -> RopeSpec:
    """A RopeSpec from a transformers>=5 `rope_parameters` entry or a classic `rope_scaling`."""
    params = dict(params or {})
    rtype = params.get("rope_type") or params.get("type") or "default"
    if rtype not in ROPE_TYPES:
        refuse(family, f"rope_scaling type {rtype!r}", f"implemented: {', '.join(ROPE_TYPES)}")
    theta = float(params.get("rope_theta", theta_default))
    if rtype == "default":
        return RopeSpec(theta)
    factor = float(params["factor"]) if params.get("factor") is not None else 1.0
    if rtype == "linear":
        return RopeSpec(theta, "linear", factor)
    if rtype == "proportional":
        return RopeSpec(theta, "proportional", factor,
                        partial=float(params.get("partial_rotary_factor") or 1.0))
    if rtype == "freq_factors":                  # GGUF rope_freqs (models/formats/gguf.py)
        return RopeSpec(theta, "freq_factors",
                        freq_factors=tuple(float(x) for x in params.get("freq_factors", ())))
    if rtype == "yarn":
        original = int(params.get("original_max_position_embeddings") or max_positions)
        if params.get("factor") is None:
            factor = (max_positions / original) if original else 1.0
        att = params.get("attention_factor")
        if att is None:
            ms, ms_all = params.get("mscale"), params.get("mscale_all_dim")
            att = (yarn_mscale(factor, ms) / yarn_mscale(factor, ms_all) if ms and ms_all
                   else yarn_mscale(factor))
        return RopeSpec(theta, "yarn", factor, original_max_positions=original,
                        beta_fast=float(params.get("beta_fast") or 32),
                        beta_slow=float(params.get("beta_slow") or 1),
                        attention_factor=float(att), truncate=bool(params.get("truncate", True)))
    return RopeSpec(theta, "llama3", factor, float(params.get("low_freq_factor", 1.0)),
                    float(params.get("high_freq_factor", 4.0)),
                    int(params.get("original_max_position_embeddings", 8192)))


def token_ids(v) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(v) if isinstance(v, (list, tuple)) else (int(v),)


def base_spec(family: str, cfg: dict, names: WeightNames, **kw) -> DecoderSpec:
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    fields = dict(
        family=family, hidden=hidden, layers=layers, heads=heads,
        kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
        max_positions=int(cfg.get("max_position_embeddings", 4096)),
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)), act=act(family, cfg),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attn_scale=head_dim ** -0.5, names=names,
        bos_token_id=cfg.get("bos_token_id"), eos_token_ids=token_ids(cfg.get("eos_token_id")))
    fields.update(kw)
    return DecoderSpec(**fields)


def layer_types(cfg: dict, layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types:
        if len(types) != layers:
            raise UnsupportedModelError(
                f"config layer_types has {len(types)} entries for {layers} layers")
        return list(types)
    return ["full_attention"] * layers


def windows(family: str, cfg: dict, types: list[str]) -> tuple:
    bad = sorted(set(types) - {"full_attention", "sliding_attention"})
    if bad:
        refuse(family, f"layer_types {bad}", "only full_attention and sliding_attention exist here")
    window = cfg.get("sliding_window")
    if "sliding_attention" in types and not window:
        raise UnsupportedModelError(f"{family}: sliding_attention layers without sliding_window")
    return tuple(int(window) if t == "sliding_attention" else None for t in types)


def classic_rope(cfg: dict) -> dict:
    """transformers<5 configs: rope_theta + rope_scaling -> one rope_parameters dict."""
    if cfg.get("rope_parameters"):
        return cfg["rope_parameters"]
    return {**(cfg.get("rope_scaling") or {}), "rope_theta": cfg.get("rope_theta", 10000.0)}



def moe_fields(family: str, cfg: dict) -> dict:
    """The mixture-of-experts fields of a transformers MoE config (Qwen3-MoE style: every
    `decoder_sparse_step`-th layer not in `mlp_only_layers` is a MoE layer)."""
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    k = int(cfg.get("num_experts_per_tok") or 0)
    width = int(cfg.get("moe_intermediate_size") or 0)
    if experts < 1 or not 1 <= k <= experts or width < 1:
        raise UnsupportedModelError(
            f"{family}: config needs num_experts >= 1, 1 <= num_experts_per_tok <= num_experts "
            f"and moe_intermediate_size >= 1 (got {experts}, {k}, {width})")
    layers = int(cfg["num_hidden_layers"])
    step = int(cfg.get("decoder_sparse_step") or 1)
    dense = set(cfg.get("mlp_only_layers") or ())
    return dict(experts=experts, experts_per_token=k, expert_intermediate=width,
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
                moe_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(layers)))
