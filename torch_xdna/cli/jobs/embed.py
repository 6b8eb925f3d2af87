"""`xdna embed TEXT ...`: sentence embeddings from the command line (bundled all-MiniLM-L6-v2
unless --model DIR). `-` reads one text per line from stdin. `--input FILE --output OUT.parquet`
runs a resumable corpus job (engine/embed/corpus.py), on this machine or on a Ray cluster (--ray)."""
from __future__ import annotations

import argparse
import json
import sys

from torch_xdna.cli.args import CliError, add_command, output_file, positive_int, with_stdin
from torch_xdna.cli.output import cost_line, npu_json


def register(subparsers) -> None:
    p = add_command(subparsers, "embed", help="print embeddings of texts",
                    description="Embed texts on the (simulated by default) NPU.",
                    epilog='examples:\n  xdna embed "hello world" "good morning"\n'
                           '  cat lines.txt | xdna embed - --json\n'
                           '  xdna embed --input corpus.jsonl --output vectors.parquet\n'
                           '  xdna embed --input corpus.txt --output v.parquet --ray\n'
                           '  xdna embed --image cat.png dog.jpg --model ./dinov2-small\n\n'
                           'A corpus job resumes where it stopped when rerun with the same '
                           'arguments\n(its progress is kept in OUTPUT.partial/).')
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to embed; '-' reads stdin lines")
    p.add_argument("--model", metavar="DIR", help="HF encoder directory (default: the bundled "
                                                  "all-MiniLM-L6-v2)")
    p.add_argument("--json", action="store_true", help="print full vectors as JSON (corpus job: "
                                                       "a JSON summary)")
    p.add_argument("--image", nargs="+", metavar="FILE", help="embed images with an image model "
                   "(--model DIR: a ViT, DINOv2 or ResNet Hugging Face directory)")
    p.add_argument("--prompt-name", metavar="NAME", help="one of the model's named prompts "
                   "(config_sentence_transformers.json, e.g. E5's query / passage; default: the "
                   "model's default_prompt_name)")
    p.add_argument("--prompt", metavar="TEXT", help="a prefix to prepend instead of a named prompt "
                   "('' for none)")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="bf16: the NPU's numerics (default); fp32: the verification mode (nothing "
                        "rounded; not what the NPU computes)")
    g = p.add_argument_group("corpus jobs")
    g.add_argument("--input", metavar="FILE", help="corpus: .jsonl (one object per line), .txt "
                                                   "(one text per line) or .parquet")
    g.add_argument("--output", metavar="FILE.parquet", help="where the (id, embedding) rows go")
    g.add_argument("--text-field", metavar="NAME", help="jsonl field / parquet column holding "
                                                        "the text (default: text)")
    g.add_argument("--id-field", metavar="NAME", help="jsonl field / parquet column holding the "
                                                      "id (default: id if present, else the line "
                                                      "number / row index)")
    g.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                   help="sequences per NPU program (default 32)")
    g.add_argument("--row-group-size", type=positive_int, default=1024, metavar="N",
                   help="input lines/rows per chunk = output row group = resume step "
                        "(default 1024)")
    g.add_argument("--overwrite", action="store_true", help="replace OUTPUT and discard an "
                                                            "interrupted job's progress")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster through Ray Data (ADDRESS, e.g. ray://host:10001 "
                        "or auto; none: a local Ray instance); needs torch-xdna[cluster]")
    g.add_argument("--ray-workers", type=positive_int, metavar="N",
                   help="embedder actors on Ray (default: one per CPU of the cluster)")
    p.set_defaults(func=run)


def _print_vectors(vecs, labels: list[str], dim: int) -> None:
    """One line per vector: its first four and last two values, its size, its label."""
    for label, v in zip(labels, vecs):
        vec = v.tolist()
        head = ", ".join(f"{x:+.4f}" for x in vec[:4])
        tail = ", ".join(f"{x:+.4f}" for x in vec[-2:])
        print(f"[{head}, ..., {tail}]  ({dim} dims)  {label}")


def run_corpus(args: argparse.Namespace) -> int:
    from torch_xdna.engine.embed.corpus import CorpusError, CorpusJob, run_job
    if args.texts:
        raise CliError("give either TEXT arguments or --input FILE, not both")
    if not args.output:
        raise CliError("--input needs --output FILE.parquet")
    out = output_file(args.output, "--output")
    if out.suffix.lower() != ".parquet":
        raise CliError(f"--output {args.output}: the output is parquet; name it *.parquet")
    job = CorpusJob(args.input, out, model=args.model, text_field=args.text_field,
                    id_field=args.id_field, batch_size=args.batch_size,
                    rows_per_group=args.row_group_size, overwrite=args.overwrite,
                    progress=not args.quiet and sys.stderr.isatty(), ray_address=args.ray,
                    ray_workers=args.ray_workers)
    try:
        s = run_job(job)
    except CorpusError as e:
        raise CliError(str(e)) from None
    if args.json:
        print(json.dumps(s.to_json()))
    else:
        resumed = f", resumed after {s.resumed_chunks} chunk(s)" if s.resumed_chunks else ""
        where = f"Ray ({s.workers} worker(s))" if s.runner == "ray" else "this machine"
        print(f"{s.rows} rows -> {s.output} ({s.model}, {s.dimensions} dims) on {where}{resumed}; "
              f"{s.truncated} truncated; NPU time {s.npu_ms:.1f} ms ({s.npu_timing}), host "
              f"{s.host_s:.1f} s", file=sys.stderr)
    return 0


def run_images(args: argparse.Namespace) -> int:
    from pathlib import Path
    from torch_xdna.engine.embed.embedder import EmbedStats
    from torch_xdna.engine.vision.image_embedder import ImageEmbedder
    from torch_xdna.models.vision import ImageInputError, is_image_model, open_image
    if args.texts or args.input:
        raise CliError("give either --image FILE... or texts/--input, not both")
    if not args.model:
        raise CliError("--image needs --model DIR (a ViT, DINOv2 or ResNet Hugging Face directory)")
    if not is_image_model(args.model):
        raise CliError(f"{args.model} is not an image model (config.json model_type vit, dinov2 "
                       f"or resnet); text models embed TEXT arguments")
    images = []
    for f in args.image:
        p = Path(f)
        if not p.is_file():
            raise CliError(f"{f}: no such file")
        try:
            images.append(open_image(p.read_bytes(), f))
        except ImageInputError as e:
            raise CliError(str(e)) from None
    emb = ImageEmbedder.load(args.model)
    stats = EmbedStats()
    vecs = emb.embed_images(images, stats)
    if args.json:
        print(json.dumps({
            "model": emb.name, "dimensions": emb.dim, "backend": emb.dev.backend,
            "pooling": emb.spec.pooling,
            "data": [{"index": i, "file": f, "embedding": v.tolist()}
                     for i, (f, v) in enumerate(zip(args.image, vecs))],
            "npu": npu_json(stats, emb.dev)}))
    else:
        _print_vectors(vecs, args.image, emb.dim)
        print(cost_line(emb.name, emb.dev, f"{len(images)} image(s)", stats), file=sys.stderr)
    emb.close()
    return 0


def run(args: argparse.Namespace) -> int:
    from torch_xdna.engine.embed.embedder import Embedder, EmbedStats
    if args.image:
        return run_images(args)
    if args.input:
        return run_corpus(args)
    if args.output:
        raise CliError("--output needs --input FILE (a corpus job)")
    texts = with_stdin(args.texts)
    if not texts or any(not t for t in texts):
        raise CliError("give non-empty texts (or '-' with lines on stdin)")
    emb = Embedder.load(args.model, precision=args.precision)
    try:
        inputs, skip = emb.with_prompt(texts, args.prompt_name, args.prompt)
    except ValueError as e:
        emb.close()
        raise CliError(str(e)) from None
    ids = emb.tokenize(inputs, truncate=False)
    cut = [i for i, x in enumerate(ids) if len(x) > emb.spec.max_seq_length]
    for i in cut:
        print(f"xdna embed: text {i + 1} has {len(ids[i])} tokens; truncated to "
              f"{emb.spec.max_seq_length} (the model's max_seq_length)", file=sys.stderr)
    stats = EmbedStats()
    vecs = emb.embed_ids([emb.tokenizer.truncate(x) for x in ids], stats, pool_skip=skip)
    if args.json:
        print(json.dumps({
            "model": emb.name, "dimensions": emb.dim, "backend": emb.dev.backend,
            "data": [{"index": i, "text": t, "tokens": len(s), "embedding": v.tolist()}
                     for i, (t, s, v) in enumerate(zip(texts, ids, vecs))],
            "usage": {"prompt_tokens": stats.tokens, "total_tokens": stats.tokens},
            "npu": npu_json(stats, emb.dev)}))
    else:
        _print_vectors(vecs, [t if len(t) <= 48 else t[:45] + "..." for t in texts], emb.dim)
        print(cost_line(emb.name, emb.dev, f"{len(texts)} input(s), {stats.tokens} tokens",
                        stats), file=sys.stderr)
    emb.close()
    return 0
