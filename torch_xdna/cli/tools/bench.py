"""`xdna bench`: run the benchmarks in benchmarks/ and print their tables (or JSON).

Each benchmark compares against a peer measured in the same run (torch on the CPU,
sentence-transformers, transformers generate); figures from the simulator say "modeled".
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

from torch_xdna.cli.args import CliError, add_command, output_file


def bench_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "benchmarks"


def available() -> dict[str, Path]:
    d = bench_dir()
    return {p.stem.removeprefix("bench_"): p for p in sorted(d.glob("bench_*.py"))} if d.is_dir() else {}


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"xdna_bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run_one(name: str, path: Path, quick: bool) -> dict:
    """A benchmark's `run(quick=...)`, or `run()` when it takes no required argument."""
    import inspect
    fn = getattr(_load(path), "run", None)
    if fn is not None:
        params = inspect.signature(fn).parameters
        if "quick" in params:
            return fn(quick=quick)
        if all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params.values()):
            return fn()
    raise CliError(f"benchmark {name} has its own options: run `python {path} --help`")


def run(args: argparse.Namespace) -> int:
    benches = available()
    if not benches:
        raise CliError(f"no benchmarks found in {bench_dir()}; run it from a source checkout "
                       f"(pip install -e .)")
    names = args.names or list(benches)
    unknown = [n for n in names if n not in benches]
    if unknown:
        raise CliError(f"unknown benchmark(s) {', '.join(unknown)}; available: "
                       f"{', '.join(benches)}")
    out = output_file(args.out, "--out")
    results = {}
    for name in names:
        if not args.json:
            print(f"== {name} ({'full' if args.full else 'quick'}) ...", flush=True)
        t0 = time.perf_counter()
        results[name] = _run_one(name, benches[name], quick=not args.full)
        results[name]["_wall_s"] = round(time.perf_counter() - t0, 1)
        if not args.json:
            print(json.dumps(results[name], indent=2))
    if args.json:
        print(json.dumps(results, indent=2))
    if out:
        out.write_text(json.dumps(results, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "bench", help="run benchmarks (simulator figures are modeled)",
                    description="Run the benchmarks in benchmarks/. Each compares with a peer "
                                "measured in the same run; simulator figures are modeled.",
                    epilog="examples:\n  xdna bench eager\n  xdna bench --json --out results.json")
    p.add_argument("names", nargs="*", help=f"benchmarks to run (default: all): "
                                           f"{', '.join(available()) or 'none found'}")
    p.add_argument("--full", action="store_true", help="larger sweeps (slower)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", help="also write the JSON results to this file")
    p.set_defaults(func=run)
