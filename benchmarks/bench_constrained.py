"""Per-token overhead of constrained decoding on this host: xgrammar vs llguidance vs outlines-core.

What is timed (measured on this host, wall clock): for every token of a schema-valid JSON answer,
compute the next-token mask, apply it to a [V] fp32 logits row, and advance the matcher by the
token -- the work the sampler adds per decoded token. Grammar compilation is reported separately
(once per request, or cached). The tokenizer is a byte-level BPE with a realistic vocabulary
(32k by default, as Llama 2 / Gemma have; Qwen3's is 151k) trained here on the Python standard
library's sources, so nothing is downloaded.

    PYTHONPATH=$PWD python benchmarks/bench_constrained.py [--vocab 32000] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
    "additionalProperties": False,
}
ANSWER = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
          "tags": ["math", "engines", "poetry"], "address": {"city": "London", "zip": "W1"},
          "active": True}


def build_tokenizer(vocab: int):
    """A byte-level BPE (tokenizers) trained on the stdlib sources; returns (tokenizer, eos id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:400]
    texts = [f.read_text(errors="ignore") for f in files]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok, tok.token_to_id("<eos>")


def token_bytes(tok) -> list[bytes]:
    """Each id's raw bytes (GPT-2 byte-to-unicode mapping undone)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    out = []
    for i in range(tok.get_vocab_size()):
        s = tok.id_to_token(i)
        out.append(bytes(dec[ch] for ch in s) if all(ch in dec for ch in s) else s.encode())
    return out


def unpack(words: torch.Tensor, V: int) -> torch.Tensor:
    """A 32-bit-word token bitmask (bit i of word i//32 = token i allowed) -> bool [V]."""
    bits = np.unpackbits(words.numpy().view(np.uint8), bitorder="little")[:V]
    return torch.from_numpy(bits.astype(bool))


def run_llguidance(tok, eos, answer_ids, V):
    import llguidance
    from llguidance.torch import allocate_token_bitmask, apply_token_bitmask_inplace, \
        fill_next_token_bitmask
    t0 = time.perf_counter()
    lt = llguidance.LLTokenizer(tok.to_str(), eos_token=eos)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    m = llguidance.LLMatcher(lt, llguidance.LLMatcher.grammar_from_json_schema(SCHEMA))
    t_compile = time.perf_counter() - t0
    mask = allocate_token_bitmask(1, V)
    logits = torch.zeros(1, V)

    def step(t):
        fill_next_token_bitmask(m, mask)
        allowed = unpack(mask[0], V)          # its torch helper needs torch.compile: numpy
        logits.masked_fill_(~allowed.unsqueeze(0), float("-inf"))
        assert allowed[t], "the answer token was masked"
        assert m.consume_token(t), m.get_error()
    return t_tok, t_compile, step, lambda: m.reset()


def run_xgrammar(tok, eos, answer_ids, V):
    import xgrammar as xgr
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo([tok.id_to_token(i) for i in range(V)],
                             vocab_type=xgr.VocabType.BYTE_LEVEL, vocab_size=V,
                             stop_token_ids=[eos])
    comp = xgr.GrammarCompiler(info)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    cg = comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                  separators=(",", ":"))
    t_compile = time.perf_counter() - t0
    m = xgr.GrammarMatcher(cg)
    mask = xgr.allocate_token_bitmask(1, V)
    logits = torch.zeros(1, V)

    def step(t):
        m.fill_next_token_bitmask(mask)
        xgr.apply_token_bitmask_inplace(logits, mask)
        assert m.accept_token(t)
    return t_tok, t_compile, step, lambda: m.reset()


def run_outlines(tok, eos, answer_ids, V):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema
    t0 = time.perf_counter()
    vmap: dict = {}
    for i, b in enumerate(token_bytes(tok)):
        if i != eos:
            vmap.setdefault(b, []).append(i)
    vocab = Vocabulary(eos, vmap)
    t_tok = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = Index(build_regex_from_schema(json.dumps(SCHEMA)), vocab)
    t_compile = time.perf_counter() - t0
    g = Guide(index)
    words = (V + 31) // 32
    mask = torch.zeros(words, dtype=torch.int32)
    logits = torch.zeros(V)

    def step(t):
        g.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())
        logits.masked_fill_(~unpack(mask, V), float("-inf"))
        g.advance(t)
    return t_tok, t_compile, step, lambda: g.reset()


LIBS = {"llguidance": run_llguidance, "xgrammar": run_xgrammar, "outlines-core": run_outlines}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    tok, eos = build_tokenizer(a.vocab)
    V = tok.get_vocab_size()
    answer_ids = tok.encode(json.dumps(ANSWER, separators=(",", ":"))).ids
    print(f"vocab {V}, answer {len(answer_ids)} tokens; measured on this host (1 thread)")
    print(f"{'library':<14} {'tokenizer s':>11} {'compile ms':>10} {'us/token med':>12} "
          f"{'p90':>8}")
    for name, fn in LIBS.items():
        try:
            t_tok, t_compile, step, reset = fn(tok, eos, answer_ids, V)
        except ImportError as e:
            print(f"{name:<14} not installed ({e.name})")
            continue
        times = []
        for _ in range(a.reps):
            reset()
            for t in answer_ids:
                s = time.perf_counter()
                step(t)
                times.append((time.perf_counter() - s) * 1e6)
        times.sort()
        print(f"{name:<14} {t_tok:>11.2f} {t_compile * 1e3:>10.1f} "
              f"{statistics.median(times):>12.0f} {times[int(0.9 * len(times))]:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
