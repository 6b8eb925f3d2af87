"""`xdna`: the command-line entry point. Each subcommand lives in its own module under cli/ and
exposes `register(subparsers)`, which adds its parser and sets `func(args) -> int`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from torch_xdna.runtime import settings

# subcommand -> its module under cli/ (jobs/: run a model; npu/: the NPU itself; tools/: estimates
# and measurements), in the order `xdna --help` lists them
COMMANDS = {"info": "npu", "demo": "tools", "doctor": "npu", "serve": "jobs", "embed": "jobs",
            "generate": "jobs", "estimate": "tools", "profile": "npu", "design": "npu",
            "kernels": "npu", "selftest": "npu", "conformance": "tools", "transcribe": "jobs",
            "upscale": "jobs", "rerank": "jobs", "bench": "tools", "pull": "jobs",
            "accuracy": "tools", "chat": "jobs", "completion": "tools"}

EPILOG = """\
examples:
  xdna info                      the device, backend and NPU generation in use
  xdna demo                      run a small model on the (simulated) NPU and print its modeled cost
  xdna doctor                    check this machine's NPU stack and say exactly what to fix
  xdna serve                     OpenAI-compatible server with the bundled all-MiniLM-L6-v2
  xdna embed "hello world"       print an embedding
  xdna generate DIR "prompt"     stream text from a Hugging Face decoder directory
  xdna chat DIR|URL              chat in the terminal with a local model or a server
  xdna bench                     run the benchmarks (figures are modeled by the simulator
                                 unless the xrt backend is in use)

environment:
  TORCH_XDNA_BACKEND=auto|sim|xrt   which runtime backend (auto: xrt when an NPU and pyxrt exist)
  TORCH_XDNA_FALLBACK=warn|error|silent   what to do with ops that have no NPU kernel
  XDNA_DEBUG=1                      show the Python traceback of an error (same as --debug)
  xdna info --env                   every variable torch-xdna reads: value, default, allowed values
"""

DEBUG_HELP = "on an error, also print the Python traceback (or set XDNA_DEBUG=1)"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"     # a timestamp on every line
LOG_HELP = "log messages of this level and above, each line timestamped (default: info for " \
           "serve, warning for the other commands)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xdna", description="PyTorch and local LLM/embedding serving on the AMD XDNA2 NPU.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from torch_xdna import __version__
    parser.add_argument("--version", action="version", version=f"torch-xdna {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS,
                        help=LOG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, group in COMMANDS.items():
        importlib.import_module(f"torch_xdna.cli.{group}.{name}").register(sub)
    for sp in sub.choices.values():
        # `xdna CMD ... --debug` works too; SUPPRESS keeps a top-level --debug from being reset
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        sp.add_argument("--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS,
                        help=LOG_HELP)
    sub.choices["completion"].set_defaults(root_parser=parser)   # it describes the whole parser
    return parser


def setup_logging(args: argparse.Namespace) -> None:
    """One log format for every command (the server's uvicorn lines too: serve hands them to
    these handlers); args.log_level is set to the level in use."""
    args.log_level = getattr(args, "log_level", None) or \
        ("info" if args.command == "serve" else "warning")
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message is meant for the user: bad input, missing files, capacity limits.
    XdnaError covers PlanError, DeviceOutOfMemory, BackendUnavailable, LaunchError,
    ArtifactError; ValueError covers ModelDirError, UnsupportedModelError, ContextOverflow."""
    from torch_xdna.cli.args import CliError
    from torch_xdna.runtime.errors import XdnaError
    return (CliError, XdnaError, ValueError, OSError, ImportError)


def describe(e: BaseException) -> str:
    """One line naming the problem and what to do."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}; check the path"
    if isinstance(e, ModuleNotFoundError) and e.name:
        return f"missing Python package {e.name!r}; install it (pip install 'torch-xdna[serve]')"
    text = " ".join(str(e).split()) or type(e).__name__
    return text.removeprefix("xdna: ")


def _debug_enabled(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "debug", False)) or settings.get("XDNA_DEBUG")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        if getattr(args, "config", None) and getattr(args, "config_parser", None):
            # a config file sets the subcommand's defaults; the flags given still win
            from torch_xdna.cli.config_file import file_defaults
            args.config_parser.set_defaults(**file_defaults(args.config_parser, args.config))
            args = parser.parse_args(argv)
        setup_logging(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:              # the one place errors reach the user
        debug = _debug_enabled(args)
        if debug:
            traceback.print_exc()
        if isinstance(e, _user_errors()):
            print(f"xdna {args.command}: error: {describe(e)}", file=sys.stderr)
            return 2
        hint = "" if debug else "; rerun with --debug (or XDNA_DEBUG=1) for the traceback"
        print(f"xdna {args.command}: error: unexpected {type(e).__name__}: {describe(e)}{hint}",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
