"""One validation pass over a decoder model directory, before anything is allocated.

config.json, generation_config.json, tokenizer_config.json / chat_template.jinja (the template
is compiled), tokenizer.json and the safetensors *headers* (shapes only, no tensor data) are
checked against what the spec will need. Every error is a ModelDirError naming the file, the
field, the value and what was expected; its `public_message` carries no server path.
Resource bounds (layers, vocabulary, context) are sanity limits here; the memory budget check
against the device is the engine's (engine/llm/decoder.py resident_bytes_estimate).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch_xdna.models.hf import ModelDirError, field_error, read_json, safetensors_files
from torch_xdna.models.spec import DecoderSpec

# Sanity bounds: far above every supported checkpoint (Llama 3 405B: 126 layers, 16384 hidden,
# 53248 intermediate; Gemma 3: 262144 vocab; Llama 3.1: 131072 context), far below what a
# typo like num_hidden_layers=1e9 would make the loader allocate.
BOUNDS = {
    "hidden_size": 1 << 16, "num_hidden_layers": 1024, "num_attention_heads": 1024,
    "num_key_value_heads": 1024, "head_dim": 1024, "intermediate_size": 1 << 20,
    "vocab_size": 1 << 22, "max_position_embeddings": 1 << 24, "sliding_window": 1 << 24,
    "sliding_window_pattern": 1024, "original_max_position_embeddings": 1 << 24,
}
REQUIRED_INTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "vocab_size")
OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "max_position_embeddings",
                 "sliding_window_pattern")
OPTIONAL_NUMBERS = ("rms_norm_eps", "rope_theta", "rope_local_base_freq", "query_pre_attn_scalar",
                    "final_logit_softcapping", "attn_logit_softcapping")
OPTIONAL_BOOLS = ("tie_word_embeddings", "use_sliding_window", "attention_bias", "mlp_bias")
OPTIONAL_STRS = ("hidden_act", "hidden_activation")
ROPE_NUMBERS = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class _Checker:
    def __init__(self, path: Path, doc: dict):
        self.path, self.doc = path, doc

    def fail(self, field: str, value: Any, expected: str) -> ModelDirError:
        return field_error(self.path, field, value, expected)

    def int(self, key: str, required: bool = False, lo: int = 1, nullable: bool = False) -> None:
        if key not in self.doc or (self.doc[key] is None and (nullable or not required)):
            if required:
                raise field_error(self.path, key, None, "an integer", shown="missing")
            return
        v = self.doc[key]
        hi = BOUNDS.get(key)
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            raise self.fail(key, v, f"an integer in [{lo}, {hi}]" if hi else f"an integer >= {lo}")

    def num(self, key: str, positive: bool = True, doc: dict | None = None, prefix: str = "") -> None:
        d = self.doc if doc is None else doc
        v = d.get(key)
        if v is None:
            return
        if not _is_num(v) or (positive and v <= 0):
            raise self.fail(prefix + key, v, "a finite number > 0" if positive else "a finite number")

    def typed(self, key: str, typ: type | tuple, what: str) -> None:
        v = self.doc.get(key)
        if v is not None and (not isinstance(v, typ) or (typ is not bool and isinstance(v, bool))):
            raise self.fail(key, v, what)

    def token_ids(self, key: str, vocab: int | None) -> None:
        v = self.doc.get(key)
        if v is None:
            return
        ids = v if isinstance(v, list) else [v]
        bound = f" < vocab_size {vocab}" if vocab else ""
        if not ids and isinstance(v, list):
            return
        for x in ids:
            if not _is_int(x) or x < 0 or (vocab and x >= vocab):
                raise self.fail(key, v, f"a token id (an integer >= 0{bound}) or a list of them")


def check_config(path: Path, cfg: Any) -> None:
    """Types, ranges and relations of the decoder fields of config.json (before spec building)."""
    if not isinstance(cfg, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(cfg).__name__}",
                            public=f"{path.name}: expected a JSON object, got {type(cfg).__name__}")
    from torch_xdna.models.families import common_config
    cfg = common_config(cfg)                  # e.g. OPT's ffn_dim is its intermediate_size
    c = _Checker(path, cfg)
    c.typed("model_type", str, "a string such as 'qwen3', 'llama' or 'gemma3_text'")
    for k in REQUIRED_INTS:
        c.int(k, required=True)
    for k in OPTIONAL_INTS:
        c.int(k)
    c.int("sliding_window", nullable=True)
    for k in OPTIONAL_NUMBERS:
        c.num(k)
    for k in OPTIONAL_BOOLS:
        c.typed(k, bool, "true or false")
    for k in OPTIONAL_STRS:
        c.typed(k, str, "an activation name string")
    for k in ("rope_scaling", "rope_parameters"):
        c.typed(k, dict, "an object (or null)")
        rp = cfg.get(k) or {}
        for sub in ([rp] + [v for v in rp.values() if isinstance(v, dict)]):
            for n in ROPE_NUMBERS:
                c.num(n, doc=sub, prefix=f"{k}.")
            v = sub.get("original_max_position_embeddings")
            if v is not None and (not _is_int(v) or not 1 <= v <= BOUNDS[
                    "original_max_position_embeddings"]):
                raise c.fail(f"{k}.original_max_position_embeddings", v, "a positive integer")
            t = sub.get("rope_type", sub.get("type"))
            if t is not None and not isinstance(t, str):
                raise c.fail(f"{k}.rope_type", t, "a string")
    types = cfg.get("layer_types")
    if types is not None and (not isinstance(types, list) or not all(isinstance(t, str) for t in types)):
        raise c.fail("layer_types", types, "a list of strings")
    if types is not None and len(types) != cfg["num_hidden_layers"]:
        raise field_error(path, "layer_types", types, f"one entry per layer (num_hidden_layers="
                          f"{cfg['num_hidden_layers']})", shown=f"a list of {len(types)}")
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    kv = cfg.get("num_key_value_heads") or heads
    if heads % kv:
        raise c.fail("num_key_value_heads", kv, f"a divisor of num_attention_heads ({heads})")
    if not cfg.get("head_dim") and hidden % heads:
        raise c.fail("hidden_size", hidden, f"a multiple of num_attention_heads ({heads}) when "
                     "head_dim is not given")
    vocab = cfg["vocab_size"]
    c.token_ids("bos_token_id", vocab)
    c.token_ids("eos_token_id", vocab)
    c.token_ids("pad_token_id", vocab)


def check_encoder_config(path: Path, cfg: dict) -> None:
    """The BERT-family fields of an encoder config.json (models/encoder.py reads them)."""
    c = _Checker(path, cfg)
    for k in REQUIRED_INTS:
        c.int(k, required=True)
    c.int("max_position_embeddings")
    c.int("type_vocab_size")
    c.num("layer_norm_eps")
    c.typed("hidden_act", str, "an activation name string")
    c.token_ids("pad_token_id", cfg["vocab_size"])


def check_generation_config(path: Path, gen: Any, vocab: int) -> None:
    """The fields of generation_config.json the engine reads (and the common sampling ones)."""
    if not isinstance(gen, dict):
        raise ModelDirError(f"{path}: expected a JSON object, got {type(gen).__name__}",
                            public=f"{path.name}: expected a JSON object, got {type(gen).__name__}")
    c = _Checker(path, gen)
    for k in ("eos_token_id", "bos_token_id", "pad_token_id"):
        c.token_ids(k, vocab)
    c.num("temperature", positive=False)
    if _is_num(gen.get("temperature")) and gen["temperature"] < 0:
        raise c.fail("temperature", gen["temperature"], "a finite number >= 0")
    top_p = gen.get("top_p")
    if top_p is not None and (not _is_num(top_p) or not 0 < top_p <= 1):
        raise c.fail("top_p", top_p, "a number in (0, 1]")
    c.int("top_k", lo=0)
    c.int("max_new_tokens")
    c.int("max_length")
    c.num("repetition_penalty")
    c.typed("do_sample", bool, "true or false")


def check_chat_template(path: Path, field: str, template: Any) -> None:
    """A chat template must be a string that compiles (jinja syntax) in the sandbox we render in."""
    from torch_xdna.models.tokenizer import compile_template
    if not isinstance(template, str):
        raise field_error(path, field, template, "a Jinja template string")
    try:
        compile_template(template)
    except Exception as e:                           # jinja2.TemplateSyntaxError and friends
        line = getattr(e, "lineno", None)
        where = f" at line {line}" if line else ""
        raise field_error(path, field, None, "a valid Jinja template", shown=f"a template with a "
                          f"syntax error{where} ({getattr(e, 'message', None) or e})") from None


def check_tokenizer(d: Path, spec: DecoderSpec) -> None:
    """tokenizer_config.json types, the chat template, and tokenizer.json loadability."""
    cfg_path = d / "tokenizer_config.json"
    tcfg = read_json(cfg_path) if cfg_path.is_file() else {}
    if not isinstance(tcfg, dict):
        raise field_error(cfg_path, "(top level)", None, "a JSON object", shown=type(tcfg).__name__)
    template = tcfg.get("chat_template")
    if isinstance(template, list):
        for i, t in enumerate(template):
            if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                raise field_error(cfg_path, f"chat_template[{i}]", t,
                                  "an object with a string 'name' and 'template'")
            check_chat_template(cfg_path, f"chat_template[{i}].template", t.get("template"))
    elif template is not None:
        check_chat_template(cfg_path, "chat_template", template)
    jinja = d / "chat_template.jinja"
    if template is None and jinja.is_file():
        try:
            text = jinja.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise field_error(jinja, "(file)", None, "a UTF-8 Jinja template",
                              shown=f"unreadable ({e})") from None
        check_chat_template(jinja, "(template)", text)
    for k in ("bos_token", "eos_token", "pad_token"):
        v = tcfg.get(k)
        if v is not None and not isinstance(v, str) and not (isinstance(v, dict)
                                                             and isinstance(v.get("content"), str)):
            raise field_error(cfg_path, k, v, "a token string or {\"content\": string}")
    tok_path = d / "tokenizer.json"
    if tok_path.is_file():
        from torch_xdna.models.tokenizer import Tokenizer
        Tokenizer(d)                                 # raises ModelDirError naming the file


def expected_shapes(spec: DecoderSpec) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF weight name -> (shape, the config fields that imply it)."""
    n, h = spec.names, spec.hidden
    out: dict[str, tuple[tuple[int, ...], str]] = {
        n.embed: ((spec.vocab, h), "vocab_size x hidden_size"),
        n.final_norm: ((h,), "hidden_size"),
    }
    if not spec.tie_embeddings:
        out[n.lm_head] = ((spec.vocab, h), "vocab_size x hidden_size")
    hd = "num_attention_heads*head_dim"
    kvd = "num_key_value_heads*head_dim"
    per_layer = {
        n.attn_norm: ((h,), "hidden_size"), n.mlp_norm: ((h,), "hidden_size"),
        n.q: ((spec.q_dim, h), f"{hd} x hidden_size"), n.k: ((spec.kv_dim, h), f"{kvd} x hidden_size"),
        n.v: ((spec.kv_dim, h), f"{kvd} x hidden_size"), n.o: ((h, spec.q_dim), f"hidden_size x {hd}"),
        n.gate: ((spec.intermediate, h), "intermediate_size x hidden_size"),
        n.up: ((spec.intermediate, h), "intermediate_size x hidden_size"),
        n.down: ((h, spec.intermediate), "hidden_size x intermediate_size"),
    }
    if not spec.gated_mlp:
        del per_layer[n.gate]
    if spec.learned_positions:
        out[n.pos_embed] = ((spec.learned_positions, h), "max_position_embeddings + offset x hidden_size")
    if spec.layer_norm:
        out[n.final_norm_bias] = ((h,), "hidden_size")
        per_layer[n.attn_norm_bias] = per_layer[n.mlp_norm_bias] = ((h,), "hidden_size")
    if spec.linear_bias:
        per_layer.update({n.q_bias: ((spec.q_dim,), hd), n.k_bias: ((spec.kv_dim,), kvd),
                          n.v_bias: ((spec.kv_dim,), kvd), n.o_bias: ((h,), "hidden_size"),
                          n.up_bias: ((spec.intermediate,), "intermediate_size"),
                          n.down_bias: ((h,), "hidden_size")})
    if spec.qk_norm:
        per_layer[n.q_norm] = ((spec.head_dim,), "head_dim")
        per_layer[n.k_norm] = ((spec.head_dim,), "head_dim")
    if spec.sandwich_norms:
        per_layer[n.attn_post_norm] = ((h,), "hidden_size")
        per_layer[n.mlp_post_norm] = ((h,), "hidden_size")
    dense = (n.gate, n.up, n.down, n.up_bias, n.down_bias)
    moe: dict[str, tuple[tuple[int, ...], str]] = {}
    if spec.experts:
        ie, what = spec.expert_intermediate, "moe_intermediate_size"
        moe[n.router] = ((spec.experts, h), "num_experts x hidden_size")
        for e in range(spec.experts):
            for tmpl, shape, why in ((n.expert_gate, (ie, h), f"{what} x hidden_size"),
                                     (n.expert_up, (ie, h), f"{what} x hidden_size"),
                                     (n.expert_down, (h, ie), f"hidden_size x {what}")):
                moe[tmpl.replace("{e}", str(e))] = (shape, why)
    attention = (n.q, n.k, n.v, n.o, n.q_norm, n.k_norm)
    if spec.attn_output_gate:
        per_layer[n.q] = ((2 * spec.q_dim, h), f"2 x {hd} x hidden_size (query and output gate)")
    linear: dict[str, tuple[tuple[int, ...], str]] = {}
    if spec.layer_kinds:
        vd = spec.linear_v_heads * spec.linear_v_dim
        hv, c = spec.linear_v_heads, spec.linear_conv_dim
        linear = {n.lin_qkv: ((c, h), "(2 key + value dims) x hidden_size"),
                  n.lin_z: ((vd, h), "value dim x hidden_size"), n.lin_b: ((hv, h), "v heads x hidden"),
                  n.lin_a: ((hv, h), "v heads x hidden"), n.lin_conv: ((c, 1, spec.linear_conv),
                                                                        "conv channels x 1 x kernel"),
                  n.lin_dt: ((hv,), "linear_num_value_heads"), n.lin_alog: ((hv,), "linear_num_value_heads"),
                  n.lin_norm: ((spec.linear_v_dim,), "linear_value_head_dim"),
                  n.lin_out: ((h, vd), "hidden_size x value dim")}
    for i in range(spec.layers):
        for tmpl, v in per_layer.items():
            if not (spec.is_moe(i) and tmpl in dense) and not (spec.is_linear(i) and tmpl in attention):
                out[tmpl.format(i=i)] = v
        for tmpl, v in (linear.items() if spec.is_linear(i) else ()):
            out[tmpl.format(i=i)] = v
        for tmpl, v in (moe.items() if spec.is_moe(i) else ()):
            out[tmpl.format(i=i)] = v
        if spec.per_layer_shapes:
            out.update(layer_shapes(spec, i))
            for tmpl in ((n.k, n.v, n.k_norm) if spec.kv_shared(i) else
                         () if spec.has_v(i) else (n.v,)):
                out.pop(tmpl.format(i=i))
    if spec.per_layer_dim:
        lp = spec.layers * spec.per_layer_dim
        out[n.ple_embed] = ((spec.per_layer_vocab, lp), "vocab_size_per_layer_input x layers*P")
        out[n.ple_proj] = ((lp, h), "layers*hidden_size_per_layer_input x hidden_size")
        out[n.ple_proj_norm] = ((spec.per_layer_dim,), "hidden_size_per_layer_input")
    return out


def layer_shapes(spec: DecoderSpec, i: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Layer i's shapes where layers differ (Gemma 4: head dim and KV heads by attention type,
    MLP width, per-layer-input weights, the layer scalar)."""
    n, h, d, f = spec.names, spec.hidden, spec.head_dim_at(i), spec.intermediate_at(i)
    q, kv, p = spec.heads * d, spec.kv_heads_at(i) * d, spec.per_layer_dim
    hd, kvd, mlp = "heads x the layer's head_dim", "the layer's KV heads x head_dim", "its MLP width"
    out = {n.q: ((q, h), hd), n.o: ((h, q), hd), n.k: ((kv, h), kvd), n.v: ((kv, h), kvd),
           n.q_norm: ((d,), "the layer's head_dim"), n.k_norm: ((d,), "the layer's head_dim"),
           n.gate: ((f, h), mlp), n.up: ((f, h), mlp), n.down: ((h, f), mlp)}
    if p:
        out.update({n.ple_gate: ((p, h), "P x hidden"), n.ple_out: ((h, p), "hidden x P"),
                    n.ple_norm: ((h,), "hidden_size")})
    if spec.layer_scale:
        out[n.layer_scalar] = ((1,), "one scalar")
    return {name.format(i=i): v for name, v in out.items()}


def weight_shapes(model_dir: Path) -> dict[str, tuple[tuple[int, ...], Path]]:
    """name -> (shape, file) from the safetensors headers only (no tensor data is read)."""
    from safetensors import safe_open
    out = {}
    for f in safetensors_files(model_dir):
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    out[name.removeprefix("language_model.")] = (tuple(fh.get_slice(name).get_shape()), f)
        except Exception as e:                       # SafetensorError, OSError, bad header
            raise ModelDirError(f"{f}: unreadable safetensors header ({e})",
                                public=f"{f.name}: unreadable safetensors header") from None
    return out


def check_weights(d: Path, spec: DecoderSpec) -> None:
    """Every weight the spec needs exists with the shape config.json implies."""
    have = weight_shapes(d)
    for name, (shape, why) in expected_shapes(spec).items():
        got = have.get(name)
        if got is None:
            raise ModelDirError(
                f"{d}: weight {name!r} is missing (config.json implies it: {spec.family}, "
                f"{spec.layers} layers, tie_word_embeddings={spec.tie_embeddings})",
                public=f"weight {name!r} is missing from the model's safetensors files")
        if tuple(got[0]) != shape:
            raise ModelDirError(
                f"{got[1]}: weight {name!r} has shape {list(got[0])}; config.json implies "
                f"{list(shape)} ({why}). The config does not match the weights",
                public=f"{got[1].name}: weight {name!r} has shape {list(got[0])}; config.json "
                       f"implies {list(shape)} ({why})")


def check_decoder_dir(d: Path, cfg: dict, spec: DecoderSpec, gen: dict | None) -> None:
    """Everything after config.json: generation config, tokenizer + template, weight shapes."""
    if gen is not None:
        check_generation_config(d / "generation_config.json", gen, spec.vocab)
    check_tokenizer(d, spec)
    check_weights(d, spec)
