"""`xdna embed TEXT ...`: sentence embeddings from the command line (bundled all-MiniLM-L6-v2
unless --model DIR). `-` reads one text per line from stdin."""
from __future__ import annotations

import argparse
import json
import sys

from torch_xdna.cli.common import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser("embed", help="print embeddings of texts",
                              description="Embed texts on the (simulated by default) NPU.",
                              epilog='examples:\n  xdna embed "hello world" "good morning"\n'
                                     '  cat lines.txt | xdna embed - --json',
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("texts", nargs="+", metavar="TEXT", help="texts to embed; '-' reads stdin lines")
    p.add_argument("--model", metavar="DIR", help="HF encoder directory (default: the bundled "
                                                  "all-MiniLM-L6-v2)")
    p.add_argument("--json", action="store_true", help="print full vectors as JSON")
    p.set_defaults(func=run)


def _texts(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for t in args.texts:
        if t == "-":
            out.extend(line.rstrip("\n") for line in sys.stdin if line.strip())
        else:
            out.append(t)
    return out


def _short(vec: list[float]) -> str:
    head = ", ".join(f"{x:+.4f}" for x in vec[:4])
    tail = ", ".join(f"{x:+.4f}" for x in vec[-2:])
    return f"[{head}, ..., {tail}]"


def run(args: argparse.Namespace) -> int:
    from torch_xdna.engine.embedder import Embedder, EmbedStats
    texts = _texts(args)
    if not texts or any(not t for t in texts):
        raise CliError("give non-empty texts (or '-' with lines on stdin)")
    emb = Embedder.load(args.model)
    ids = emb.tokenize(texts, truncate=False)
    cut = [i for i, x in enumerate(ids) if len(x) > emb.spec.max_seq_length]
    for i in cut:
        print(f"xdna embed: text {i + 1} has {len(ids[i])} tokens; truncated to "
              f"{emb.spec.max_seq_length} (the model's max_seq_length)", file=sys.stderr)
    stats = EmbedStats()
    vecs = emb.embed_ids([emb.tokenizer.truncate(x) for x in ids], stats)
    backend = "simulated NPU" if emb.dev.backend == "sim" else f"{emb.dev.backend} NPU"
    timing = "modeled" if emb.dev.backend == "sim" else "measured"
    if args.json:
        print(json.dumps({
            "model": emb.name, "dimensions": emb.dim, "backend": emb.dev.backend,
            "data": [{"index": i, "text": t, "tokens": len(s), "embedding": v.tolist()}
                     for i, (t, s, v) in enumerate(zip(texts, ids, vecs))],
            "usage": {"prompt_tokens": stats.tokens, "total_tokens": stats.tokens},
            "npu": {"dispatches": stats.dispatches, f"{timing}_ms": stats.modeled_us / 1e3,
                    "host_ms": stats.host_s * 1e3}}))
    else:
        for t, v in zip(texts, vecs):
            label = t if len(t) <= 48 else t[:45] + "..."
            print(f"{_short(v.tolist())}  ({emb.dim} dims)  {label}")
        print(f"{emb.name} on {backend}: {len(texts)} input(s), {stats.tokens} tokens, "
              f"{stats.dispatches} dispatch(es), NPU time {stats.modeled_us / 1e3:.2f} ms "
              f"({timing}), host {stats.host_s * 1e3:.0f} ms", file=sys.stderr)
    emb.close()
    return 0
