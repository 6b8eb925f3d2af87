"""`xdna`: the command-line entry point. Each subcommand lives in its own module under cli/ and
exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand modules, in the order `xdna --help` lists them
COMMANDS = ("info", "demo", "doctor", "serve", "embed", "generate", "estimate", "profile", "bench")

EPILOG = """\
examples:
  xdna info                      the device, backend and NPU generation in use
  xdna demo                      run a small model on the (simulated) NPU and print its modeled cost
  xdna doctor                    check this machine's NPU stack and say exactly what to fix
  xdna serve                     OpenAI-compatible server with the bundled all-MiniLM-L6-v2
  xdna embed "hello world"       print an embedding
  xdna generate DIR "prompt"     stream text from a Hugging Face decoder directory
  xdna bench                     run the benchmarks (figures are modeled by the simulator
                                 unless the xrt backend is in use)

environment:
  TORCH_XDNA_BACKEND=auto|sim|xrt   which runtime backend (auto: xrt when an NPU and pyxrt exist)
  TORCH_XDNA_FALLBACK=warn|error|silent   what to do with ops that have no NPU kernel
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xdna", description="PyTorch and local LLM/embedding serving on the AMD XDNA2 NPU.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from torch_xdna import __version__
    parser.add_argument("--version", action="version", version=f"torch-xdna {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"torch_xdna.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"torch_xdna.cli.{name}":
                continue            # subcommand not built yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
