"""Modeled NPU cost of a decoder from its config alone (no weights): decode ms/token,
dispatches/token, MB/token, ratio to the DRAM-bandwidth floor, prefill tok/s.

Every figure is the simulator's cost model applied to the engine's own plans, i.e. exactly what
the sim backend charges when the engine runs (tests check the two agree); none is a measurement.
"""
from __future__ import annotations

from pathlib import Path

from torch_xdna.choices import DEFAULT_KV_DTYPE
from torch_xdna.engine.llm.decoder import DEFAULT_CHUNK, DEFAULT_LAYOUT, PrecisionPolicy, estimate_step
from torch_xdna.hw import Generation, get_generation
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.models.families import BUILTIN_CONFIGS, family_of, spec_from_config
from torch_xdna.models.hf import read_config
from torch_xdna.models.spec import DecoderSpec
from torch_xdna.models.validate import check_config
from torch_xdna.runtime import settings
from torch_xdna.runtime.sim.cost import CostModel, stream_bandwidth


def resolve_spec(model: str) -> tuple[str, DecoderSpec]:
    """A model directory (config.json only), a .gguf file (its metadata only) or a built-in
    shape name like 'qwen3-0.6b', or a packaged checkpoint's name (models/packaged.py)."""
    from torch_xdna.models.packaged import CHECKPOINTS, resolve
    if not Path(model).exists() and model in CHECKPOINTS:
        model = str(resolve(model))
    if Path(model).is_file():
        from torch_xdna.models.loader import read_gguf
        return Path(model).name, read_gguf(Path(model)).spec
    if Path(model).is_dir():
        cfg = read_config(model)
        family_of(cfg)
        check_config(Path(model) / "config.json", cfg)      # bounds before any shape math
        return Path(model).name, spec_from_config(cfg)
    key = model.lower()
    if key in BUILTIN_CONFIGS:
        return key, spec_from_config(BUILTIN_CONFIGS[key])
    raise ValueError(f"{model!r} is neither a model directory nor a built-in shape "
                     f"({', '.join(BUILTIN_CONFIGS)})")


def default_generation() -> Generation:
    return get_generation(settings.get("TORCH_XDNA_GENERATION"))


def parse_contexts(text: str) -> list[int]:
    """'1k,2k,4k,32768,128K' -> [1024, 2048, 4096, 32768, 131072] (k = 1024 tokens)."""
    out = []
    for part in str(text).split(","):
        p = part.strip().lower()
        if not p:
            continue
        mult = 1024 if p.endswith("k") else 1
        try:
            n = int(float(p[:-1] if mult > 1 else p) * mult)
        except ValueError:
            raise ValueError(f"context {part.strip()!r} is not a token count; use e.g. 4096 or "
                             f"4k (= 4096), comma-separated for several") from None
        if n <= 0:
            raise ValueError(f"context {part.strip()!r} is not allowed; give an integer >= 1 "
                             f"(k = 1024 tokens, e.g. 4k)")
        out.append(n)
    if not out:
        raise ValueError("no context given; use e.g. --context 1k,4k,32k")
    return out


def estimate(spec: DecoderSpec, precision="bf16", context: int = 1024, *, group: int = 0,
             prefill_chunk: int = DEFAULT_CHUNK, gen: Generation | None = None,
             layout: str = DEFAULT_LAYOUT, kv_dtype: str = DEFAULT_KV_DTYPE) -> dict:
    """Modeled cost of decoding at `context` tokens and of prefilling a `context`-token prompt.
    The KV cache is sized for the context (context + 1 positions); a context beyond the model's
    maximum is still modeled and flagged (beyond_model_max)."""
    gen = gen or default_generation()
    policy = PrecisionPolicy.parse(precision, group)
    cap = context + 1
    cost = CostModel(gen)
    memo: dict = {}
    # prefill a `context`-token prompt in chunks, then decode (the first decode step loads the
    # decode program; the second is the steady state reported)
    prefill_us, pos = 0.0, 0
    while pos < context:
        n = min(prefill_chunk, context - pos)
        s = estimate_step(spec, policy, cost, rows_bucket(n, prefill_chunk), pos, n, cap,
                          pos + n == context, layout, kv_dtype, memo)
        prefill_us += s["modeled_us"]
        pos += n
    estimate_step(spec, policy, cost, 1, context, 1, cap, True, layout, kv_dtype, memo)
    step = estimate_step(spec, policy, cost, 1, context, 1, cap, True, layout, kv_dtype, memo)
    decode_us = step["modeled_us"]
    # the floor: every byte of a token (weights, KV) as one single-pass stream at the cost
    # model's weight-stream rate (cost-v3; 38.5 GB/s on npu4, below the 52.7 GB/s pure read)
    floor_bps = stream_bandwidth(gen, gen.columns.value)
    floor_us = step["dram_bytes"] / floor_bps * 1e6
    return {
        "precision": policy.ident(), "layout": layout, "context": context, "generation": gen.name,
        "kv_dtype": kv_dtype, "max_positions": spec.max_positions,
        "beyond_model_max": context > spec.max_positions,
        "params_m": spec.params() / 1e6, "layers": spec.layers,
        "active_params_m": spec.params(active=True) / 1e6,
        "modeled_decode_ms_per_token": decode_us / 1e3,
        "modeled_decode_tok_s": 1e6 / decode_us,
        "dispatches_per_token": step["dispatches"], "launches_per_token": step["launches"],
        "kernel_runs_per_token": step["kernel_runs"],
        "configure_points_per_token": step["configure_points"],
        "launches_per_layer": (step["launches"] - 2) / spec.layers,
        "mb_per_token": step["dram_bytes"] / 1e6,
        "weight_mb_per_token": step["weight_bytes"] / 1e6,
        "kv_mb_per_token": step["kv_bytes"] / 1e6,
        "expert_mb_per_token": step["expert_bytes"] / 1e6,     # MoE: the chosen experts only
        "floor_ms_per_token": floor_us / 1e3, "floor_ratio": decode_us / floor_us,
        "decode_terms_ms": {k: v / 1e3 for k, v in step["terms_us"].items()},
        "modeled_prefill_ms": prefill_us / 1e3,
        "modeled_prefill_tok_s": context / (prefill_us * 1e-6) if prefill_us else 0.0,
        "dram_bps": floor_bps,
    }
