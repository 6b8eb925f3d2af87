"""Serving benchmark: the prefix cache on a follow-up chat turn; continuous batching.

Measured (wall clock on this host): time to first token of a follow-up turn (turn 1's prompt +
its answer + a new user message) with the prefix cache and without, same engine shapes, median
of several turns with different new messages; also each turn's tokens are checked identical.
The simulator executes the NPU-numerics references in PyTorch on the CPU, so host TTFT mostly
measures prefill compute skipped.

Modeled (simulator cost model, never a hardware measurement): the same turns' prefill time from
the device counters, and from plans only at Qwen3-0.6B shapes (bf16, 2k context): prefilling a
follow-up prompt whole vs prefilling only the part after the cached prefix, plus the cache flush
of the restored KV buffers that the device charges.

Continuous batching (engine/batching.py), 1/2/4/8 concurrent sequences: modeled device tok/s
from plans at Qwen3-0.6B shapes (bf16 and int4, 1k context; the weights stream once per step),
and on the tiny model the modeled tok/s from the device counters and the tok/s measured on this
host (the simulator runs each row's reference on the CPU, so host tok/s does not gain from
batching the way the device does), with every sequence's tokens checked against its tokens
decoded alone.

    python benchmarks/bench_serving.py [--quick] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torch_xdna.engine.batching import BatchSession, estimate_batch_step
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


def _tiny_qwen3(tmp: str) -> None:
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(vocab_size=4096, hidden_size=256, intermediate_size=768,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=32, max_position_embeddings=2048, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).float().eval().save_pretrained(tmp)


def measured_batching(sizes=(1, 2, 4, 8), prompt: int = 24, new: int = 16) -> list[dict]:
    """BatchSession on the tiny model: N sequences decode together (after their prefills)."""
    g = torch.Generator().manual_seed(3)
    prompts = [_tokens(prompt, g) for _ in range(max(sizes))]
    cfg = GenerationConfig(max_tokens=new, stop_token_ids=())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        _tiny_qwen3(tmp)
        eng = load_decoder(Path(tmp), "bf16", max_context=256, quiet=True, prefix_cache=0,
                           device=SimDevice(get_generation("npu4"), 8 << 30))
        alone = [eng.complete(p, cfg).token_ids for p in prompts]
        for n in sizes:
            with BatchSession(eng, slots=max(sizes)) as session:
                seqs = [session.add(p, cfg) for p in prompts[:n]]
                session.step()                                   # program load, not timed
                t0 = time.perf_counter()
                session.run()
                wall = time.perf_counter() - t0
            steps = session.modeled_step_us[1:]
            toks = sum(k for k, _ in steps)
            rows.append({"sequences": n, "new_tokens_each": new,
                         "host_tok_s_measured": toks / wall,
                         "device_tok_s_modeled": toks / (sum(u for _, u in steps) * 1e-6),
                         "tokens_equal_alone": [s.token_ids for s in seqs] == alone[:n]})
        eng.close()
    OPERANDS.clear()
    return rows


def modeled_batching(model: str = "qwen3-0.6b", context: int = 1024, cap: int = 2048,
                     sizes=(1, 2, 4, 8)) -> list[dict]:
    """Plan-only batched decode steps at `context` for every sequence."""
    _, spec = resolve_spec(model)
    gen = get_generation("npu4")
    out = []
    for precision in ("bf16", "int4"):
        policy = PrecisionPolicy.parse(precision, 0)
        for n in sizes:
            cost = CostModel(gen)
            estimate_batch_step(spec, policy, cost, (context,) * n, max(sizes), cap)   # load
            s = estimate_batch_step(spec, policy, cost, (context,) * n, max(sizes), cap)
            out.append({"model": model, "precision": precision, "context": context,
                        "sequences": n, "step_ms_modeled": s["modeled_us"] / 1e3,
                        "device_tok_s_modeled": s["modeled_tok_s"],
                        "mb_per_step": s["dram_bytes"] / 1e6})
    return out


def measured_follow_up(system: int, user: int, answer: int, reps: int) -> dict:
    """TTFT of follow-up turns with and without the prefix cache (tiny random Qwen3)."""
    g = torch.Generator().manual_seed(1)
    turn1 = _tokens(system + user, g)
    follow = [_tokens(user, g) for _ in range(reps)]
    gen1 = GenerationConfig(max_tokens=answer, stop_token_ids=())
    gen2 = GenerationConfig(max_tokens=4, stop_token_ids=())
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        _tiny_qwen3(tmp)
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
    return {"follow_up_turn": measured, "plans": modeled_plans(),
            "batching_plans": modeled_batching(),
            "batching_measured": measured_batching(new=8 if quick else 16)}


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
    print("continuous batching, plans (modeled), per sequence context 1k:")
    for r in res["batching_plans"]:
        print(f"  {r['model']} {r['precision']:5s} N={r['sequences']}: step "
              f"{r['step_ms_modeled']:.2f} ms, {r['device_tok_s_modeled']:.1f} tok/s, "
              f"{r['mb_per_step']:.0f} MB/step")
    print("continuous batching, tiny model (counters modeled, host measured):")
    for r in res["batching_measured"]:
        print(f"  N={r['sequences']}: device {r['device_tok_s_modeled']:.0f} tok/s modeled, host "
              f"{r['host_tok_s_measured']:.1f} tok/s measured; tokens equal alone: "
              f"{r['tokens_equal_alone']}")


if __name__ == "__main__":
    main()
