"""`xdna rerank QUERY DOC... --model DIR`: score documents for a query with a cross-encoder
(a HF *ForSequenceClassification directory, e.g. cross-encoder/ms-marco-MiniLM-L6-v2) and print
them best first. `-` as a document reads one document per line from stdin."""
from __future__ import annotations

import argparse
import json
import sys

from torch_xdna.cli.args import CliError, add_command, positive_int, with_stdin
from torch_xdna.cli.output import cost_line, npu_json


def register(subparsers) -> None:
    p = add_command(subparsers, "rerank", help="rank documents for a query with a cross-encoder",
                    description="Rerank documents on the (simulated by default) NPU.",
                    epilog='examples:\n  xdna rerank "capital of France" "Paris is the '
                           'capital." "Berlin is in Germany." --model DIR\n'
                           '  cat docs.txt | xdna rerank "query" - --model DIR --json')
    p.add_argument("query", metavar="QUERY", help="the search query")
    p.add_argument("docs", nargs="+", metavar="DOC", help="documents; '-' reads stdin lines")
    p.add_argument("--model", metavar="DIR", required=True,
                   help="HF cross-encoder directory (BertForSequenceClassification)")
    p.add_argument("--top-n", type=positive_int, metavar="N", help="print only the N best")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torch_xdna.engine.embed.embedder import EmbedStats
    from torch_xdna.engine.embed.reranker import Reranker
    from torch_xdna.models.cross_encoder import is_cross_encoder_dir
    docs = with_stdin(args.docs)
    if not args.query or not docs or any(not d for d in docs):
        raise CliError("give a non-empty query and non-empty documents (or '-' with lines on stdin)")
    if not is_cross_encoder_dir(args.model):
        raise CliError(f"{args.model}: not a cross-encoder (config.json architectures is not "
                       "*ForSequenceClassification); for sentence embeddings use `xdna embed`")
    rr = Reranker.load(args.model)
    stats = EmbedStats()
    try:
        results = rr.rank(args.query, docs, args.top_n, stats)
    finally:
        rr.close()
    if args.json:
        print(json.dumps({
            "model": rr.name, "query": args.query, "backend": rr.dev.backend,
            "results": [{"index": r.index, "relevance_score": r.score, "logit": r.logit,
                         "document": {"text": docs[r.index]}} for r in results],
            "usage": {"prompt_tokens": stats.tokens, "total_tokens": stats.tokens},
            "npu": npu_json(stats, rr.dev)}))
    else:
        for rank, r in enumerate(results, 1):
            d = docs[r.index]
            print(f"{rank:>3}. {r.score:.4f}  [{r.index}] {d if len(d) <= 70 else d[:67] + '...'}")
        print(cost_line(rr.name, rr.dev, f"{len(docs)} document(s), {stats.tokens} tokens",
                        stats), file=sys.stderr)
    return 0
