"""Decoder host speed: the engine (sim functional level, bf16 NPU numerics) vs HF transformers
bf16 and llama.cpp (bf16, Q8_0) on a Qwen3-0.6B-shaped random-weight model, on this host.

All figures are MEASURED wall clock on this host (the simulator executes the designs' NPU-numerics
references in PyTorch on the CPU); nothing here is an NPU figure. The model has the real
Qwen3-0.6B config's shapes (models/families.py BUILTIN_CONFIGS["qwen3-0.6b"]) and random
weights, built with transformers in bf16 and saved as an HF directory (safetensors) in a temp
dir; the engine loads that directory, HF runs the same model object, llama.cpp a GGUF converted
from the same weights (tests/gguf_fixtures.write_gguf: bf16 and Q8_0 via gguf.quants).

Per contender, with the same torch/llama.cpp thread count (default 1): prefill of PREFILL
tokens (the same random prompt ids) from an empty cache -> tok/s; then DECODE greedy tokens one
at a time -> tok/s. The contenders run alternately, REPS rounds; median, min and max printed,
and the load average (`uptime`) with them. Greedy tokens of engine and HF are compared.
llama.cpp is optional: skipped with a message when `llama_cpp` is not importable (install
the `bench` extra: llama-cpp-python builds llama.cpp from source).

    python benchmarks/bench_llm_host.py [--reps 5] [--prefill 1024] [--decode 32] [--threads 1]
        [--only engine,hf,llamacpp-bf16,llamacpp-q8_0] [--layers N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def build_hf_dir(path: Path, layers: int | None = None, seed: int = 0):
    """The Qwen3-0.6B-shaped random model (bf16) saved to `path`; returns the HF model."""
    from transformers import AutoModelForCausalLM, Qwen3Config
    from torch_xdna.models.families import BUILTIN_CONFIGS
    c = dict(BUILTIN_CONFIGS["qwen3-0.6b"])
    c.pop("model_type")
    theta = c.pop("rope_theta")
    if layers:
        c["num_hidden_layers"] = layers
    cfg = Qwen3Config(**c, rope_parameters={"rope_type": "default", "rope_theta": theta},
                      initializer_range=0.02)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return model


def _vocab_tokenizer(n: int):
    """A GGUF vocabulary for llama.cpp: `n` distinct tokens (the byte-level alphabet, then
    fillers), one merge (llama.cpp requires the key). The benchmark feeds token ids, so only the count matters."""
    def add(w) -> None:
        from gguf import TokenType
        from tokenizers.pre_tokenizers import ByteLevel
        alpha = sorted(ByteLevel.alphabet())
        tokens = alpha + [f"<t{i}>" for i in range(n - len(alpha))]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([TokenType.NORMAL] * n)
        w.add_token_merges([f"{alpha[0]} {alpha[1]}"])     # llama.cpp needs the key
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
        w.add_add_bos_token(False)
    return add


def write_ggufs(model, tmp: Path, qtypes=("BF16", "Q8_0")) -> dict[str, Path]:
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_fixtures import write_gguf
    tok = _vocab_tokenizer(model.config.vocab_size)
    return {q: write_gguf(model, "qwen3", tmp / f"model-{q}.gguf", q, tok) for q in qtypes}


# -- contenders: each returns (prefill_s, decode_s, tokens) for one round ----------------------
class EngineRunner:
    name = "engine"

    def __init__(self, path: Path, capacity: int):
        from torch_xdna.engine.llm.generate import load_decoder
        from torch_xdna.hw import get_generation
        from torch_xdna.runtime.sim import SimDevice
        self.eng = load_decoder(path, "bf16", max_context=capacity, quiet=True, prefix_cache=0,
                                device=SimDevice(get_generation("npu4"), 16 << 30))
        self.dec = self.eng.decoder

    def run(self, prompt: list[int], n_new: int):
        dec = self.dec
        dec.reset()
        t0 = time.perf_counter()
        logits = dec.forward(prompt)
        t1 = time.perf_counter()
        toks = [int(logits.argmax())]
        for _ in range(n_new - 1):
            toks.append(int(dec.forward([toks[-1]]).argmax()))
        return t1 - t0, time.perf_counter() - t1, toks

    def close(self):
        self.eng.close()


class HFRunner:
    name = "hf"

    def __init__(self, model):
        self.model = model

    @torch.no_grad()
    def run(self, prompt: list[int], n_new: int):
        from transformers import DynamicCache
        m = self.model
        cache = DynamicCache(config=m.config)
        t0 = time.perf_counter()
        out = m(torch.tensor([prompt]), cache=cache, use_cache=True,
                logits_to_keep=1)
        t1 = time.perf_counter()
        toks = [int(out.logits[0, -1].argmax())]
        for _ in range(n_new - 1):
            out = m(torch.tensor([[toks[-1]]]), cache=cache,
                    use_cache=True)
            toks.append(int(out.logits[0, -1].argmax()))
        return t1 - t0, time.perf_counter() - t1, toks

    def close(self):
        pass


class LlamaCppRunner:
    def __init__(self, path: Path, qtype: str, threads: int, capacity: int):
        from llama_cpp import Llama
        self.name = f"llamacpp-{qtype.lower()}"
        self.llm = Llama(model_path=str(path), n_ctx=capacity, n_threads=threads,
                         n_threads_batch=threads, n_batch=512, verbose=False)

    def run(self, prompt: list[int], n_new: int):
        import numpy as np
        llm = self.llm
        llm.reset()
        n_vocab = llm.n_vocab()

        def last() -> int:         # eval() keeps no logits without logits_all: read the context's
            return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        toks = [last()]
        for _ in range(n_new - 1):
            llm.eval([toks[-1]])
            toks.append(last())
        return t1 - t0, time.perf_counter() - t1, toks

    def close(self):
        self.llm.close()


def _load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def host_memory() -> dict:
    """The host's memory condition: the read rate of a freshly allocated 256 MB buffer (one
    thread, the best of 3 sums) and the page cache size. Decode reads every weight per token,
    so it follows this rate. On the 2-core VM these figures come from, the rate of fresh memory
    fell from 13-15 GB/s to 7-9 GB/s when the page cache held ~7 GB (a clone of 10 copies of one
    tensor: the later ones read at half the rate of the first) and recovered after
    `sync; echo 3 > /proc/sys/vm/drop_caches` (docs/llm.md 'Host speed'): compare ratios within
    one run, and state the page cache with a figure."""
    x = torch.ones(64 << 20)                        # 256 MB fp32, touched once by the fill
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    cached = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("Cached:"):
                cached = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {"fresh_read_gb_s": round(best, 1), "page_cache_mb": cached}


def run(reps: int = 5, n_prefill: int = 1024, n_decode: int = 32, threads: int = 1,
        only: set[str] | None = None, layers: int | None = None, check: bool = True,
        quick: bool = False) -> dict:
    """The comparison; `quick` (what `xdna bench llm_host` runs without --full): 2 rounds,
    a 128-token prompt, 8 new tokens, 4 of the 28 layers."""
    if quick:
        reps, n_prefill, n_decode, layers = 2, 128, 8, layers or 4
    torch.set_num_threads(threads)
    want = lambda n: only is None or n in only          # noqa: E731
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        t0 = time.perf_counter()
        model = build_hf_dir(tmp / "hf", layers)
        notes = [f"model built + saved in {time.perf_counter() - t0:.1f} s"]
        cap = n_prefill + n_decode + 8
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(10, model.config.vocab_size - 10, (n_prefill,), generator=g).tolist()
        runners = []
        if want("engine"):
            runners.append(EngineRunner(tmp / "hf", cap))
        if want("hf"):
            runners.append(HFRunner(model))
        lc = [q for q in ("BF16", "Q8_0") if want(f"llamacpp-{q.lower()}")]
        if lc:
            try:
                import llama_cpp  # noqa: F401
                for q, p in write_ggufs(model, tmp, tuple(lc)).items():
                    runners.append(LlamaCppRunner(p, q, threads, cap))
            except ImportError:
                notes.append("llama.cpp skipped: llama_cpp is not importable "
                             "(pip install -e '.[bench]' builds llama-cpp-python from source)")
        for r in runners:                                   # warm-up round, not timed
            r.run(prompt[:64], 4)
        memory = [host_memory()]
        res = {r.name: {"prefill_s": [], "decode_s": [], "tokens": None} for r in runners}
        loads = []
        for _ in range(reps):                               # alternate contenders per round
            for r in runners:
                p, d, toks = r.run(prompt, n_decode)
                res[r.name]["prefill_s"].append(p)
                res[r.name]["decode_s"].append(d)
                res[r.name]["tokens"] = toks
                print(f"round {len(loads) + 1}/{reps} {r.name}: prefill {n_prefill / p:.1f} "
                      f"tok/s, decode {(n_decode - 1) / d:.2f} tok/s ({_load()})",
                      file=sys.stderr, flush=True)
            loads.append(os.getloadavg()[0])
        memory.append(host_memory())
        unchanged = None
        if check and "engine" in res:          # the host kernels off: the same greedy tokens?
            eng = next(r for r in runners if r.name == "engine")
            os.environ["TORCH_XDNA_HOST_KERNELS"] = "0"
            try:
                unchanged = eng.run(prompt, n_decode)[2] == res["engine"]["tokens"]
            finally:
                del os.environ["TORCH_XDNA_HOST_KERNELS"]
        for r in runners:
            r.close()
    out = {"model": f"qwen3-0.6b shapes (random weights, {model.config.num_hidden_layers} layers), bf16",
           "threads": threads, "prefill_tokens": n_prefill, "decode_tokens": n_decode,
           "reps": reps, "load_avg_1m": loads, "host_memory": memory, "notes": notes,
           "contenders": {}}
    for name, r in res.items():
        pf = [n_prefill / s for s in r["prefill_s"]]
        dc = [(n_decode - 1) / s for s in r["decode_s"]]
        out["contenders"][name] = {
            "prefill_tok_s": {"median": statistics.median(pf), "min": min(pf), "max": max(pf)},
            "decode_tok_s": {"median": statistics.median(dc), "min": min(dc), "max": max(dc)},
            "tokens": r["tokens"]}
    if "engine" in res:
        ref = res["engine"]["tokens"]
        out["greedy_prefix_agreeing_with_engine"] = {
            name: next((i for i, (a, b) in enumerate(zip(ref, r["tokens"])) if a != b), len(ref))
            for name, r in res.items() if name != "engine"}
        out["engine_tokens_unchanged_without_host_kernels"] = unchanged
    return out


def print_table(res: dict) -> None:
    print(f"MEASURED on this host: {res['model']}, {res['threads']} thread(s), prefill "
          f"{res['prefill_tokens']} tokens, decode {res['decode_tokens']} greedy tokens, "
          f"median of {res['reps']} alternating rounds (min..max); 1-min load avg per round "
          f"{', '.join(f'{x:.2f}' for x in res['load_avg_1m'])}")
    mem = res.get("host_memory") or []
    if mem:
        print("  host memory before / after the rounds: fresh-buffer read "
              + " / ".join(f"{m['fresh_read_gb_s']} GB/s" for m in mem) + ", page cache "
              + " / ".join(f"{m['page_cache_mb']} MB" for m in mem)
              + " (decode reads every weight per token; see host_memory())")
    c = res["contenders"]
    ref = c.get("engine")
    for name, r in c.items():
        pf, dc = r["prefill_tok_s"], r["decode_tok_s"]
        line = (f"  {name:15s} prefill {pf['median']:8.1f} tok/s ({pf['min']:.1f}..{pf['max']:.1f})"
                f"   decode {dc['median']:6.2f} tok/s ({dc['min']:.2f}..{dc['max']:.2f})")
        if ref is not None and name != "engine":
            line += (f"   engine/this: prefill {ref['prefill_tok_s']['median'] / pf['median']:.2f}x"
                     f" decode {ref['decode_tok_s']['median'] / dc['median']:.2f}x")
        print(line)
    agree = res.get("greedy_prefix_agreeing_with_engine")
    if agree:
        print("  leading greedy tokens equal to the engine's: " + ", ".join(
            f"{k} {v}/{res['decode_tokens']}" for k, v in agree.items())
            + " (HF bf16 rounds activations to bf16, llama.cpp Q8_0 quantizes: near-ties of a"
            " random model flip)")
    if res.get("engine_tokens_unchanged_without_host_kernels") is not None:
        print("  engine tokens identical with TORCH_XDNA_HOST_KERNELS=0 (fp32 BLAS path): "
              f"{res['engine_tokens_unchanged_without_host_kernels']} (False: an fp32 summation-"
              "order change flipped a near-tie; docs/llm.md 'Host speed' has one analysed)")
    for n in res["notes"]:
        print(f"  note: {n}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (quick looks only)")
    ap.add_argument("--only", default=None, help="comma list: engine,hf,llamacpp-bf16,llamacpp-q8_0")
    ap.add_argument("--no-check", action="store_true",
                    help="skip the engine re-run with host kernels off (token check)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    result = run(a.reps, a.prefill, a.decode, a.threads,
                 set(a.only.split(",")) if a.only else None, a.layers, not a.no_check)
    if not a.json:
        print_table(result)
    print(json.dumps({k: v for k, v in result.items()}, indent=1, default=float)
          if a.json else "", end="")
