"""Serving benchmark: the prefix cache on a follow-up chat turn.

Measured (wall clock on this host): time to first token of a follow-up turn (turn 1's prompt +
its answer + a new user message) with the prefix cache and without, same engine shapes, median
of several turns with different new messages; also each turn's tokens are checked identical.
The simulator executes the NPU-numerics references in PyTorch on the CPU, so host TTFT mostly
measures prefill compute skipped.

Modeled (simulator cost model, never a hardware measurement): the same turns' prefill time from
the device counters, and from plans only at Qwen3-0.6B shapes (bf16, 2k context): prefilling a
follow-up prompt whole vs prefilling only the part after the cached prefix, plus the cache flush
of the restored KV buffers that the device charges.

    python benchmarks/bench_serving.py [--quick] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from torch_xdna.engine.decoder import DEFAULT_CHUNK, PrecisionPolicy, estimate_step
from torch_xdna.engine.estimate import resolve_spec
from torch_xdna.engine.generate import GenerationConfig, load_decoder
from torch_xdna.engine.prefix_cache import BLOCK
from torch_xdna.hw import get_generation
from torch_xdna.kernels.llm_blocks import OPERANDS, rows_bucket
from torch_xdna.runtime.sim import SimDevice
from torch_xdna.runtime.sim.cost import CostModel


def _tokens(n: int, g: torch.Generator) -> list[int]:
    return [int(x) for x in torch.randint(10, 4000, (n,), generator=g)]


def measured_follow_up(system: int, user: int, answer: int, reps: int) -> dict:
    """TTFT of follow-up turns with and without the prefix cache (tiny random Qwen3)."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    g = torch.Generator().manual_seed(1)
    turn1 = _tokens(system + user, g)
    follow = [_tokens(user, g) for _ in range(reps)]
    gen1 = GenerationConfig(max_tokens=answer, stop_token_ids=())
    gen2 = GenerationConfig(max_tokens=4, stop_token_ids=())
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        for name, size in (("off", 0), ("on", 256 << 20)):
            eng = load_decoder(Path(tmp), "bf16", max_context=1024, quiet=True, prefix_cache=size,
                               device=SimDevice(get_generation("npu4"), 8 << 30))
            eng.complete(turn1[:40], gen2)                          # warm both programs
            first = eng.complete(turn1, gen1)
            ttft, modeled, cached, outs = [], [], [], []
            for msg in follow:
                r = eng.complete(turn1 + first.token_ids + msg, gen2)
                ttft.append(r.stats.measured_ttft_s)
                modeled.append(r.stats.modeled_prefill_us)
                cached.append(r.stats.cached_tokens)
                outs.append(r.token_ids)
            rows[name] = {"ttft_s_measured": statistics.median(ttft),
                          "prefill_ms_modeled": statistics.median(modeled) / 1e3,
                          "cached_tokens": statistics.median(cached), "tokens": outs,
                          "prompt_tokens": len(turn1) + len(first.token_ids) + user}
            eng.close()
    OPERANDS.clear()
    same = rows["on"].pop("tokens") == rows["off"].pop("tokens")
    return {"model": "qwen3 random h256 L4 V4096 bf16", "median_of": reps, **{
        f"{k}_{name}": v for name, r in rows.items() for k, v in r.items()},
        "ttft_speedup_measured": rows["off"]["ttft_s_measured"] / rows["on"]["ttft_s_measured"],
        "prefill_saved_ms_modeled": rows["off"]["prefill_ms_modeled"]
        - rows["on"]["prefill_ms_modeled"],
        "tokens_identical": same}


def _prefill_us(spec, policy, cost, start: int, end: int, cap: int) -> float:
    us, pos = 0.0, start
    while pos < end:
        n = min(DEFAULT_CHUNK, end - pos)
        us += estimate_step(spec, policy, cost, rows_bucket(n, DEFAULT_CHUNK), pos, n, cap,
                            pos + n == end)["modeled_us"]
        pos += n
    return us


def modeled_plans(model: str = "qwen3-0.6b", prompt: int = 1536, cached: int = 1408,
                  cap: int = 2048, precision: str = "bf16") -> dict:
    """Plan-only prefill of a `prompt`-token follow-up turn whole vs after `cached` tokens."""
    _, spec = resolve_spec(model)
    policy = PrecisionPolicy.parse(precision, 0)
    gen = get_generation("npu4")
    cached = cached // BLOCK * BLOCK
    cost = CostModel(gen)
    _prefill_us(spec, policy, cost, 0, DEFAULT_CHUNK, cap)         # programs loaded (warm)
    whole = _prefill_us(spec, policy, cost, 0, prompt, cap)
    rest = _prefill_us(spec, policy, cost, cached, prompt, cap)
    kv_bytes = 2 * spec.layers * spec.kv_heads * cap * spec.head_dim * 2
    flush = kv_bytes / 1e6 * gen.flush_us_per_mb.value            # what the sim charges on restore
    return {"model": model, "precision": precision, "prompt_tokens": prompt,
            "cached_tokens": cached, "generation": gen.name,
            "prefill_ms_modeled_without": whole / 1e3,
            "prefill_ms_modeled_with": (rest + flush) / 1e3,
            "restore_flush_ms_modeled": flush / 1e3,
            "ttft_speedup_modeled": whole / (rest + flush)}


def run(quick: bool = False) -> dict:
    measured = (measured_follow_up(192, 24, 16, 3) if quick
                else measured_follow_up(448, 32, 32, 5))
    return {"follow_up_turn": measured, "plans": modeled_plans()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    res = run(args.quick)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    m, p = res["follow_up_turn"], res["plans"]
    print(f"follow-up turn, {m['model']}, {m['prompt_tokens_on']} prompt tokens, "
          f"{m['cached_tokens_on']:.0f} reused (median of {m['median_of']}):")
    print(f"  TTFT measured on this host: {m['ttft_s_measured_off'] * 1e3:.1f} ms without, "
          f"{m['ttft_s_measured_on'] * 1e3:.1f} ms with the prefix cache "
          f"({m['ttft_speedup_measured']:.2f}x); tokens identical: {m['tokens_identical']}")
    print(f"  prefill modeled: {m['prefill_ms_modeled_off']:.2f} ms without, "
          f"{m['prefill_ms_modeled_on']:.2f} ms with (saved {m['prefill_saved_ms_modeled']:.2f} ms)")
    print(f"plans, {p['model']} {p['precision']} on {p['generation']}: {p['prompt_tokens']}-token "
          f"follow-up, {p['cached_tokens']} cached: prefill modeled "
          f"{p['prefill_ms_modeled_without']:.1f} ms -> {p['prefill_ms_modeled_with']:.1f} ms "
          f"(incl. {p['restore_flush_ms_modeled']:.2f} ms restore flush; "
          f"{p['ttft_speedup_modeled']:.1f}x)")


if __name__ == "__main__":
    main()
