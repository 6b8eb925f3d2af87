"""Supported decoder families as data: config.json -> DecoderSpec, and built-in shapes.

Each family is one builder plus a weight-name map. Config features the engine does not implement
are refused here, by name, before any weight is read. The rules the builders share (refusals,
RoPE parameters, the common fields, windows, MoE fields) are models/family_parts.py's; gpt-oss's
builder is in models/families_moe.py; FAMILIES below stays the one table.
"""
from __future__ import annotations

import math
from typing import Callable

from torch_xdna.models.families_moe import gpt_oss
from torch_xdna.models.family_parts import (  # noqa: F401  (MOE_FAMILIES, LLAMA_NAMES: named from here)
    LAYER, LLAMA_NAMES, MOE_FAMILIES, base_spec, classic_rope, common_checks, layer_types,
    moe_fields, refuse, rope_spec, windows,
)
from torch_xdna.models.spec import DecoderSpec, RopeSpec, UnsupportedModelError, WeightNames

# config keys a family spells its own way -> the common spelling the checks and builders read
CONFIG_ALIASES = {"opt": {"ffn_dim": "intermediate_size", "activation_function": "hidden_act"}}


NESTED_TEXT = ("qwen3_5", "gemma4", "gemma3")  # multimodal configs whose decoder is their text_config


def common_config(cfg):
    """`cfg` with its family's own key spellings (CONFIG_ALIASES) also under the common names;
    a vision-language config (NESTED_TEXT) as its text_config."""
    if (isinstance(cfg, dict) and cfg.get("model_type") in NESTED_TEXT
            and isinstance(cfg.get("text_config"), dict)):
        tie = cfg.get("tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings"))
        return {**cfg["text_config"], "model_type": cfg["model_type"], "tie_word_embeddings": tie,
                "vision_language": True}
    aliases = CONFIG_ALIASES.get(cfg.get("model_type")) if isinstance(cfg, dict) else None
    if not aliases:
        return cfg
    return {**{dst: cfg[src] for src, dst in aliases.items() if src in cfg}, **cfg}

QWEN3_NAMES = WeightNames(**{**LLAMA_NAMES.__dict__, "q_norm": LAYER + "self_attn.q_norm.weight",
                             "k_norm": LAYER + "self_attn.k_norm.weight"})
QWEN3_MOE_NAMES = WeightNames(**{**QWEN3_NAMES.__dict__, "router": LAYER + "mlp.gate.weight",
                                 "expert_gate": LAYER + "mlp.experts.{e}.gate_proj.weight",
                                 "expert_up": LAYER + "mlp.experts.{e}.up_proj.weight",
                                 "expert_down": LAYER + "mlp.experts.{e}.down_proj.weight"})
QWEN3_5_NAMES = WeightNames(**{**QWEN3_NAMES.__dict__, **{
    k: LAYER + "linear_attn." + v for k, v in (
        ("lin_qkv", "in_proj_qkv.weight"), ("lin_z", "in_proj_z.weight"),
        ("lin_b", "in_proj_b.weight"), ("lin_a", "in_proj_a.weight"),
        ("lin_conv", "conv1d.weight"), ("lin_dt", "dt_bias"), ("lin_alog", "A_log"),
        ("lin_norm", "norm.weight"), ("lin_out", "out_proj.weight"))}})
_O = "model.decoder.layers.{i}."
OPT_NAMES = WeightNames(
    embed="model.decoder.embed_tokens.weight", final_norm="model.decoder.final_layer_norm.weight",
    lm_head="lm_head.weight", attn_norm=_O + "self_attn_layer_norm.weight",
    q=_O + "self_attn.q_proj.weight", k=_O + "self_attn.k_proj.weight",
    v=_O + "self_attn.v_proj.weight", o=_O + "self_attn.out_proj.weight",
    mlp_norm=_O + "final_layer_norm.weight", gate="", up=_O + "fc1.weight", down=_O + "fc2.weight",
    pos_embed="model.decoder.embed_positions.weight",
    attn_norm_bias=_O + "self_attn_layer_norm.bias", q_bias=_O + "self_attn.q_proj.bias",
    k_bias=_O + "self_attn.k_proj.bias", v_bias=_O + "self_attn.v_proj.bias",
    o_bias=_O + "self_attn.out_proj.bias", mlp_norm_bias=_O + "final_layer_norm.bias",
    up_bias=_O + "fc1.bias", down_bias=_O + "fc2.bias",
    final_norm_bias="model.decoder.final_layer_norm.bias")
GEMMA3_NAMES = WeightNames(**{**QWEN3_NAMES.__dict__,
                              "attn_post_norm": LAYER + "post_attention_layernorm.weight",
                              "mlp_norm": LAYER + "pre_feedforward_layernorm.weight",
                              "mlp_post_norm": LAYER + "post_feedforward_layernorm.weight"})


def llama(cfg: dict, family: str = "llama", names: WeightNames = LLAMA_NAMES, **kw) -> DecoderSpec:
    common_checks(family, cfg, moe=bool(kw.get("experts")))
    rope = rope_spec(family, classic_rope(cfg), 10000.0, int(cfg.get("max_position_embeddings", 0)))
    layers = int(cfg["num_hidden_layers"])
    types = layer_types(cfg, layers)
    if not cfg.get("use_sliding_window", False):
        types = ["full_attention"] * layers           # Qwen lists sliding types but disables them
    return base_spec(family, cfg, names, ropes={"global": rope}, layer_rope=("global",) * layers,
                 layer_window=windows(family, cfg, types), **kw)


def qwen3(cfg: dict) -> DecoderSpec:
    return llama(cfg, "qwen3", QWEN3_NAMES, qk_norm=True)


def qwen3_moe(cfg: dict) -> DecoderSpec:
    fields = moe_fields("qwen3_moe", cfg)
    return llama(cfg, "qwen3_moe", QWEN3_MOE_NAMES, qk_norm=True, **fields)


def gemma3(cfg: dict) -> DecoderSpec:
    """Gemma 3 text (gemma3_text), or the decoder of a multimodal gemma3 config (its text_config;
    the SigLIP tower and projector are engine/llm/vlm.py's)."""
    family = "gemma3"
    cfg = common_config(cfg)
    common_checks(family, cfg)
    layers = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if not types:
        pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                 for i in range(layers)]
    types = layer_types({"layer_types": types}, layers)
    rp = cfg.get("rope_parameters")
    if rp and "full_attention" in rp:
        mp = int(cfg.get("max_position_embeddings", 0))
        ropes = {"global": rope_spec(family, rp["full_attention"], 1e6, mp),
                 "local": rope_spec(family, rp.get("sliding_attention"), 1e4, mp)}
    else:
        ropes = {"global": rope_spec(family, classic_rope(cfg), 1e6,
                                 int(cfg.get("max_position_embeddings", 0))),
                 "local": RopeSpec(float(cfg.get("rope_local_base_freq", 10000.0)))}
    hidden = int(cfg["hidden_size"])
    qpa = cfg.get("query_pre_attn_scalar")
    spec = base_spec(
        family, cfg, GEMMA3_NAMES,
        ropes=ropes, layer_rope=tuple("local" if t == "sliding_attention" else "global" for t in types),
        layer_window=windows(family, cfg, types), qk_norm=True, norm_offset=1.0,
        embed_scale=math.sqrt(hidden), sandwich_norms=True,
        # Gemma3ForConditionalGeneration's head never soft-caps (transformers 5.25)
        final_softcap=None if cfg.get("vision_language") else cfg.get("final_logit_softcapping"),
        attn_softcap=cfg.get("attn_logit_softcapping"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)))
    if qpa:
        spec = _replace(spec, attn_scale=float(qpa) ** -0.5)
    return spec


def _replace(spec: DecoderSpec, **kw) -> DecoderSpec:
    from dataclasses import replace
    return replace(spec, **kw)


def qwen3_5(cfg: dict) -> DecoderSpec:
    """Qwen3.5 (text decoder): every `full_attention_interval`-th layer is gated full attention
    (q_proj also gives a per-head output gate; q/k norm; partial RoPE), the others gated
    DeltaNet linear attention (a recurrent state per layer instead of KV); (1+w) RMSNorms."""
    family = "qwen3_5"
    cfg = common_config(cfg)
    common_checks(family, cfg)
    layers = int(cfg["num_hidden_layers"])
    every = int(cfg.get("full_attention_interval") or 4)
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % every == 0
                                       else "linear_attention" for i in range(layers)]
    types = layer_types({"layer_types": types}, layers)
    bad = sorted(set(types) - {"full_attention", "linear_attention"})
    if bad:
        refuse(family, f"layer_types {bad}", "full_attention and linear_attention only")
    rp = classic_rope(cfg)
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    partial = float(rp.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0)
    rotary = int(head_dim * partial)
    spec = base_spec(
        family, cfg, QWEN3_5_NAMES,
        ropes={"global": rope_spec(family, rp, 10000.0, int(cfg.get("max_position_embeddings", 0)))},
        layer_rope=("global",) * layers, layer_window=(None,) * layers, qk_norm=True,
        norm_offset=1.0, tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        layer_kinds=tuple("linear" if t == "linear_attention" else "attention" for t in types),
        linear_k_heads=int(cfg["linear_num_key_heads"]),
        linear_v_heads=int(cfg["linear_num_value_heads"]),
        linear_k_dim=int(cfg["linear_key_head_dim"]), linear_v_dim=int(cfg["linear_value_head_dim"]),
        linear_conv=int(cfg.get("linear_conv_kernel_dim") or 4), attn_output_gate=True,
        rotary_dim=rotary if rotary < head_dim else 0)
    if spec.linear_v_heads % spec.linear_k_heads:
        raise UnsupportedModelError(f"{family}: linear_num_value_heads must be a multiple of "
                                    f"linear_num_key_heads")
    if cfg.get("vision_language"):
        spec = _replace(spec, run_refusal=(
            "qwen3_5: a vision-language checkpoint (Qwen3_5ForConditionalGeneration): the engine "
            "runs the text decoder of a qwen3_5_text directory (image input is not implemented); "
            "xdna estimate models its text decoder"))
    return spec


def gemma4_names(prefix: str) -> WeightNames:
    """Gemma 4's tensor names under `prefix` ('model.', or 'model.language_model.' in the
    multimodal Gemma4ForConditionalGeneration checkpoints)."""
    base = {k: v.replace("model.", prefix, 1) for k, v in GEMMA3_NAMES.__dict__.items() if v}
    lp = prefix + "layers.{i}."
    return WeightNames(**base, ple_embed=prefix + "embed_tokens_per_layer.weight",
                       ple_proj=prefix + "per_layer_model_projection.weight",
                       ple_proj_norm=prefix + "per_layer_projection_norm.weight",
                       ple_gate=lp + "per_layer_input_gate.weight",
                       ple_out=lp + "per_layer_projection.weight",
                       ple_norm=lp + "post_per_layer_input_norm.weight",
                       layer_scalar=lp + "layer_scalar")


GEMMA4_TOWERS = ("vision_tower.", "audio_tower.", "embed_vision.", "embed_audio.")
GEMMA4_LAYER_KEYS = ("head_dim", "num_key_value_heads")


def _gemma4_layer_shapes(family: str, cfg: dict, types: list[str]) -> tuple[list[int], list[int]]:
    """Per-layer head dim and KV heads as transformers resolves them: a saved `per_layer_config`
    (sparse, layer index -> overrides), else full-attention layers take `global_head_dim` (512
    when absent) and, with attention_k_eq_v, `num_global_key_value_heads`."""
    dims = [int(cfg.get("head_dim") or 256)] * len(types)
    kvs = [int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])] * len(types)
    plc = cfg.get("per_layer_config")
    if plc is None:
        plc = {i: {"head_dim": cfg.get("global_head_dim", 512)} for i, t in enumerate(types)
               if t == "full_attention"}
        if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads"):
            for o in plc.values():
                o["num_key_value_heads"] = cfg["num_global_key_value_heads"]
    for key, over in dict(plc).items():
        i = int(key)
        if not (isinstance(over, dict) and 0 <= i < len(types)):
            refuse(family, f"per_layer_config[{key!r}]", "layer index -> {head_dim, num_key_value_heads}")
        for k, v in over.items():
            if k not in GEMMA4_LAYER_KEYS:
                refuse(family, f"per_layer_config[{key}].{k}", f"overrides of {GEMMA4_LAYER_KEYS} only")
            (dims if k == "head_dim" else kvs)[i] = int(v)
    return dims, kvs


def _gemma4_kv_source(types: list[str], shared: int) -> list[int]:
    """transformers' kv_sharing_modes: the last `shared` layers attend over the KV of the last
    earlier (non-shared) layer of their type."""
    first = len(types) - shared
    if shared and sorted(set(types[:first])) != sorted(set(types)):
        raise UnsupportedModelError("gemma4: num_kv_shared_layers leaves a layer type with no "
                                    "layer producing its KV")
    last = {t: i for i, t in enumerate(types[:first])}
    return [i if i < first else last[t] for i, t in enumerate(types)]


def gemma4(cfg: dict) -> DecoderSpec:
    """Gemma 4 text decoder (E2B/E4B/31B; gemma4_text, or a gemma4 multimodal checkpoint's
    text part): Gemma 3's sandwich norms with plain-w RMSNorms, attention scale 1, unscaled-
    weight value norms, sliding layers (head_dim, default RoPE) and full layers (global head
    dim, proportional RoPE), the last layers reusing earlier layers' KV, per-layer inputs (PLE)
    added after each layer, a per-layer output scalar, and double-wide MLPs in KV-shared layers."""
    family = "gemma4"
    cfg = common_config(cfg)
    if cfg.get("enable_moe_block"):
        refuse(family, "enable_moe_block=true (a dense MLP plus a routed-experts block per "
                "layer, Gemma 4 26B-A4B)", "the dense Gemma 4 models (E2B, E4B, 31B) run")
    common_checks(family, cfg)
    if cfg.get("use_bidirectional_attention") == "all":
        refuse(family, "use_bidirectional_attention='all'", "causal decoding only")
    layers = int(cfg["num_hidden_layers"])
    types = list(cfg.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else
                                             "sliding_attention" for i in range(layers)])
    types = layer_types({"layer_types": types}, layers)
    types[-1] = "full_attention"                      # as transformers forces it
    mp = int(cfg.get("max_position_embeddings", 0))
    rp = cfg.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                           "rope_theta": 1e6}}
    dims, kvs = _gemma4_layer_shapes(family, cfg, types)
    source = _gemma4_kv_source(types, int(cfg.get("num_kv_shared_layers") or 0))
    wide = 2 if cfg.get("use_double_wide_mlp") else 1
    inter = int(cfg["intermediate_size"])
    ple = int(cfg.get("hidden_size_per_layer_input") or 0)
    prefix = "model.language_model." if cfg.get("vision_language") else "model."
    ignored = tuple(prefix.replace("language_model.", "") + t for t in GEMMA4_TOWERS) if (
        cfg.get("vision_language")) else ()
    ignored += tuple(f"{prefix}layers.{i}.self_attn.{w}" for i in range(layers) if source[i] != i
                     for w in ("k_proj", "v_proj", "k_norm", "v_norm"))
    return base_spec(
        family, cfg, gemma4_names(prefix),
        ropes={"global": rope_spec(family, rp.get("full_attention"), 1e6, mp),
               "local": rope_spec(family, rp.get("sliding_attention"), 1e4, mp)},
        layer_rope=tuple("local" if t == "sliding_attention" else "global" for t in types),
        layer_window=windows(family, cfg, types), qk_norm=True, attn_scale=1.0,
        embed_scale=math.sqrt(int(cfg["hidden_size"])), sandwich_norms=True,
        final_softcap=cfg.get("final_logit_softcapping"),
        tie_embeddings=cfg.get("tie_word_embeddings") is not False,
        head_dim=dims[0], kv_heads=kvs[0], layer_head_dims=tuple(dims), layer_kv_heads=tuple(kvs),
        layer_intermediate=tuple(inter * (wide if source[i] != i else 1) for i in range(layers)),
        kv_source=tuple(source), v_norm=True, k_eq_v=bool(cfg.get("attention_k_eq_v")),
        per_layer_dim=ple, per_layer_vocab=int(cfg.get("vocab_size_per_layer_input") or 0) if ple else 0,
        layer_scale=True, ignored_weights=ignored)


OPT_POSITION_OFFSET = 2          # transformers' OPTLearnedPositionalEmbedding.offset


def opt(cfg: dict) -> DecoderSpec:
    """OPT (Meta): pre-LayerNorm blocks with biases everywhere, a ReLU MLP (fc1 -> relu -> fc2),
    learned absolute positions (row = position + 2), full multi-head attention, tied lm_head."""
    family = "opt"
    cfg = common_config(cfg)
    common_checks(family, {k: v for k, v in cfg.items() if k not in ("attention_bias",)})
    hidden = int(cfg["hidden_size"])
    for key, ok, why in (
            ("do_layer_norm_before", cfg.get("do_layer_norm_before", True) is True,
             "post-LayerNorm blocks (OPT-350m) are not implemented"),
            ("word_embed_proj_dim", int(cfg.get("word_embed_proj_dim") or hidden) == hidden,
             "embedding projections (project_in/out) are not implemented"),
            ("_remove_final_layer_norm", not cfg.get("_remove_final_layer_norm"),
             "a decoder without its final LayerNorm is not implemented"),
            ("enable_bias", cfg.get("enable_bias", True) is True, "bias-free OPT is not implemented"),
            ("layer_norm_elementwise_affine", cfg.get("layer_norm_elementwise_affine", True) is True,
             "LayerNorm without weights is not implemented")):
        if not ok:
            refuse(family, f"{key}={cfg.get(key)!r}", why)
    layers = int(cfg["num_hidden_layers"])
    positions = int(cfg.get("max_position_embeddings", 2048))
    return base_spec(family, {**cfg, "num_key_value_heads": cfg["num_attention_heads"],
                          "rms_norm_eps": 1e-5, "hidden_act": cfg.get("hidden_act") or "relu"},
                 OPT_NAMES, layer_rope=("",) * layers, layer_window=(None,) * layers,
                 tie_embeddings=bool(cfg.get("tie_word_embeddings", True)), layer_norm=True,
                 linear_bias=True, gated_mlp=False,
                 learned_positions=positions + OPT_POSITION_OFFSET,
                 position_offset=OPT_POSITION_OFFSET)


FAMILIES: dict[str, Callable[[dict], DecoderSpec]] = {
    "qwen3": qwen3, "llama": llama, "gemma3_text": gemma3, "gemma3": gemma3, "qwen3_moe": qwen3_moe,
    "gpt_oss": gpt_oss, "opt": opt, "qwen3_5_text": qwen3_5, "qwen3_5": qwen3_5,
    "gemma4_text": gemma4, "gemma4": gemma4,
}
HINTS: dict[str, str] = {}


def family_of(cfg: dict) -> Callable[[dict], DecoderSpec]:
    """The spec builder of a config's model_type; UnsupportedModelError when there is none."""
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or mt not in FAMILIES:
        raise UnsupportedModelError(
            f"model_type {mt!r} is not supported by the xdna decode engine "
            f"(supported: {', '.join(FAMILIES)})" + (f"; {HINTS[mt]}" if mt in HINTS else ""))
    return FAMILIES[mt]


def spec_from_config(cfg: dict) -> DecoderSpec:
    """The DecoderSpec of a HF config dict; UnsupportedModelError names what is not supported."""
    return family_of(cfg)(cfg)


_QWEN3_5 = dict(           # what the Qwen3.5 small models' text configs share
    model_type="qwen3_5_text", num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2,
    head_dim=256, vocab_size=248320, linear_num_key_heads=16, linear_num_value_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    full_attention_interval=4, max_position_embeddings=262144, rms_norm_eps=1e-6,
    tie_word_embeddings=True, hidden_act="silu", eos_token_id=248044,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25})

# Built-in configs (shapes only, no weights) for `xdna estimate` and the benchmark.
# gemma-4-e2b: 35 layers (4 sliding : 1 full, the last full), hidden 1536, 8 query heads, 1 KV
# head, head dims 256 / 512, intermediate 6144, PLE 256, sliding window 512, as the Gemma 4
# model card and write-ups state; ASSUMED, not read from google/gemma-4-E2B's config.json (no
# network here): num_kv_shared_layers 20, use_double_wide_mlp, no attention_k_eq_v (with them
# the text decoder has 2.3B parameters besides the PLE table, the published "2.3B effective")
BUILTIN_CONFIGS: dict[str, dict] = {
    "qwen3-0.6b": dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=151643, eos_token_id=151645),
    "qwen3-1.7b": dict(
        model_type="qwen3", hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=6144, vocab_size=151936,
        max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, hidden_act="silu", eos_token_id=151645),
    "llama-3.2-1b": dict(
        model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=128000, eos_token_id=128001),
    "gemma-3-1b": dict(
        model_type="gemma3_text", hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_local_base_freq=10000.0, sliding_window=512, sliding_window_pattern=6,
        query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=[1, 106]),
    # Qwen/Qwen3-30B-A3B config.json (Hugging Face model card): 128 experts, 8 per token
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=False, hidden_act="silu",
        bos_token_id=151643, eos_token_id=151645),
    # Qwen/Qwen3.5-0.8B config.json's text_config (hybrid [3 linear, 1 full] x 6)
    "qwen3.5-0.8b": {**_QWEN3_5, "hidden_size": 1024, "intermediate_size": 3584},
    # Qwen3.5-2B: hidden_size 2048 as published; the other fields ASSUMED to follow 0.8B's
    # pattern (not verified against its config.json): intermediate 6144, 24 layers
    "qwen3.5-2b": {**_QWEN3_5, "hidden_size": 2048, "intermediate_size": 6144},
    "gemma-4-e2b": dict(
        model_type="gemma4_text", hidden_size=1536, num_hidden_layers=35, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, intermediate_size=6144,
        vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
        num_kv_shared_layers=20, use_double_wide_mlp=True, max_position_embeddings=131072,
        sliding_window=512, rms_norm_eps=1e-6, final_logit_softcapping=30.0,
        layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                     for i in range(35)],
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, bos_token_id=2,
        eos_token_id=[1, 106]),
    # facebook/opt-125m config.json
    "opt-125m": dict(
        model_type="opt", hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        ffn_dim=3072, vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=768,
        do_layer_norm_before=True, activation_function="relu", enable_bias=True,
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=2),
    # openai/gpt-oss-20b config.json: 24 layers, 32 experts, 4 per token (transformers'
    # GptOssConfig defaults are gpt-oss-120b's: 36 layers, 128 experts)
    "gpt-oss-20b": dict(
        model_type="gpt_oss", hidden_size=2880, num_hidden_layers=24, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=32,
        num_experts_per_tok=4, vocab_size=201088, max_position_embeddings=131072,
        rms_norm_eps=1e-5, sliding_window=128, attention_bias=True, tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention"] * 12, hidden_act="silu",
        rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096,
                         "rope_theta": 150000.0},
        bos_token_id=199998, eos_token_id=200002),
}
