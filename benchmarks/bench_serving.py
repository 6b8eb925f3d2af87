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

Continuous batching (engine/llm/batching.py), 1/2/4/8 concurrent sequences: modeled device tok/s
from plans at Qwen3-0.6B shapes (bf16 and int4, 1k context; the weights stream once per step),
and on the tiny model the modeled tok/s from the device counters and the tok/s measured on this
host (the simulator runs each row's reference on the CPU, so host tok/s does not gain from
batching the way the device does), with every sequence's tokens checked against its tokens
decoded alone.

Through the HTTP server (`xdna serve`'s app on a loopback port, uvicorn): 1/2/4/8 concurrent
chat clients (httpx, non-streaming, greedy), each round once batched (--max-batch 8) and once
with --max-batch 1, the two alternating, several rounds each: measured aggregate completion
tok/s (median, min, max) and request latency p50/p95 over all rounds, plus the modeled device
tok/s of the round (device counters; prefills included). Every client's answer is checked equal
between the two modes.

    python benchmarks/bench_serving.py [--quick] [--json] [--http-only]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from torch_xdna.engine.llm.batching import BatchSession, estimate_batch_step
from torch_xdna.engine.llm.decoder import DEFAULT_CHUNK, PrecisionPolicy, estimate_step
from torch_xdna.engine.llm.estimate import resolve_spec
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.engine.llm.prefix_cache import BLOCK
from torch_xdna.hw import get_generation
from torch_xdna.kernels.blocks.llm import rows_bucket
from torch_xdna.kernels.blocks.operands import OPERANDS
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


def _tiny_chat_model(tmp: str) -> None:
    """The tiny Qwen3 above plus a locally trained byte-level BPE tokenizer and chat template
    (nothing downloads), so the HTTP server can serve it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    _tiny_qwen3(tmp)
    cfg_path = Path(tmp) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg_path.write_text(json.dumps(cfg))
    specials = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(_CLIENT_TEXTS) * 30], trainer)
    tok.save(str(Path(tmp) / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    (Path(tmp) / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "chat_template": template, "tokenizer_class": "PreTrainedTokenizerFast"}))


_CLIENT_TEXTS = ["what is the capital of norway and why", "write a short poem about the sea",
                 "explain continuous batching in one paragraph", "list three prime numbers",
                 "how does a neural processing unit work", "translate good morning to french",
                 "summarize the plot of a mystery novel", "give me a recipe for pancakes"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))]


def http_batching(clients=(1, 2, 4, 8), rounds: int = 5, new: int = 32) -> dict:
    """Concurrent chat clients against the real HTTP server, batched vs --max-batch 1."""
    import os
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-chat"
        model_dir.mkdir()
        _tiny_chat_model(str(model_dir))
        reg = ModelRegistry(max_models=1, max_context=256)
        reg.add_dir(model_dir)
        app = create_app(ServerConfig(default_model=False, max_batch=max(clients),
                                      max_new_tokens=new), registry=reg)
        srv = app.state.server
        with BackgroundServer(app) as live:
            url = live.url + "/v1/chat/completions"

            def one(i: int, http: httpx.Client) -> tuple[float, int, str]:
                body = {"model": "tiny-chat", "max_tokens": new, "temperature": 0,
                        "messages": [{"role": "user", "content": _CLIENT_TEXTS[i]}]}
                t0 = time.perf_counter()
                r = http.post(url, json=body, timeout=300)
                r.raise_for_status()
                d = r.json()
                return (time.perf_counter() - t0, d["usage"]["completion_tokens"],
                        d["choices"][0]["message"]["content"])

            def round_(n: int, max_batch: int) -> dict:
                srv.batcher.max_batch = max_batch
                gate = threading.Barrier(n)
                c0 = srv.dev.counters.modeled_us

                def client(i):
                    with httpx.Client() as http:
                        gate.wait()
                        return one(i, http)
                t0 = time.perf_counter()
                with ThreadPoolExecutor(n) as pool:
                    out = list(pool.map(client, range(n)))
                wall = time.perf_counter() - t0
                toks = sum(k for _, k, _ in out)
                return {"tok_s": toks / wall, "lat": [x for x, _, _ in out],
                        "texts": [t for _, _, t in out],
                        "modeled_tok_s": toks / max(1e-12, (srv.dev.counters.modeled_us - c0) * 1e-6)}

            round_(max(clients), max(clients))               # warm: programs for every bucket
            for n in (1, 2, 4, 8):
                if n <= max(clients):
                    round_(n, max(clients))
            round_(1, 1)
            for n in clients:
                res = {"batched": [], "single": []}
                for _ in range(rounds):                        # alternate the two modes
                    res["batched"].append(round_(n, max(clients)))
                    res["single"].append(round_(n, 1))
                row = {"clients": n, "rounds": rounds, "new_tokens_each": new,
                       "answers_equal": all(b["texts"] == s["texts"] for b, s in
                                            zip(res["batched"], res["single"]))}
                for mode, rs in res.items():
                    tps = [r["tok_s"] for r in rs]
                    lat = [x for r in rs for x in r["lat"]]
                    row[mode] = {"host_tok_s_measured_median": statistics.median(tps),
                                 "host_tok_s_measured_min": min(tps),
                                 "host_tok_s_measured_max": max(tps),
                                 "latency_s_p50": _pct(lat, 0.5), "latency_s_p95": _pct(lat, 0.95),
                                 "device_tok_s_modeled": statistics.median(
                                     r["modeled_tok_s"] for r in rs)}
                row["speedup_measured"] = (row["batched"]["host_tok_s_measured_median"]
                                           / row["single"]["host_tok_s_measured_median"])
                rows.append(row)
            largest = srv.batcher.runner("tiny-chat", srv.registry.loaded["tiny-chat"]).max_batch
    OPERANDS.clear()
    return {"model": "qwen3 random h256 L4 V4096 bf16, context 256", "rows": rows,
            "largest_batched_step": largest, "load_average": os.getloadavg()}


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


def run(quick: bool = False, http_only: bool = False) -> dict:
    http = (http_batching((1, 4), rounds=2, new=12) if quick else http_batching())
    if http_only:
        return {"http_batching": http}
    measured = (measured_follow_up(192, 24, 16, 3) if quick
                else measured_follow_up(448, 32, 32, 5))
    return {"follow_up_turn": measured, "plans": modeled_plans(),
            "batching_plans": modeled_batching(),
            "batching_measured": measured_batching(new=8 if quick else 16),
            "http_batching": http}


def print_http(h: dict) -> None:
    print(f"HTTP server, {h['model']}, concurrent chat clients (host measured, device modeled; "
          f"load average {', '.join(f'{x:.1f}' for x in h['load_average'])}):")
    for r in h["rows"]:
        b, s = r["batched"], r["single"]
        print(f"  {r['clients']} clients x {r['new_tokens_each']} tokens, {r['rounds']} rounds: "
              f"batched {b['host_tok_s_measured_median']:.1f} tok/s "
              f"({b['host_tok_s_measured_min']:.1f}-{b['host_tok_s_measured_max']:.1f}), p50/p95 "
              f"{b['latency_s_p50']:.2f}/{b['latency_s_p95']:.2f} s, device "
              f"{b['device_tok_s_modeled']:.0f} tok/s modeled | --max-batch 1 "
              f"{s['host_tok_s_measured_median']:.1f} tok/s "
              f"({s['host_tok_s_measured_min']:.1f}-{s['host_tok_s_measured_max']:.1f}), p50/p95 "
              f"{s['latency_s_p50']:.2f}/{s['latency_s_p95']:.2f} s, device "
              f"{s['device_tok_s_modeled']:.0f} tok/s modeled | {r['speedup_measured']:.2f}x; "
              f"answers equal: {r['answers_equal']}")
    print(f"  largest batched step: {h['largest_batched_step']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--http-only", action="store_true", help="only the HTTP server rounds")
    args = ap.parse_args()
    res = run(args.quick, args.http_only)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    if args.http_only:
        print_http(res["http_batching"])
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
    print_http(res["http_batching"])


if __name__ == "__main__":
    main()
