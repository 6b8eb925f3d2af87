"""Argument types and the error type shared by the `xdna` subcommands.

Bad input is refused while parsing (argparse prints `xdna CMD: error: ...` and exits 2) or by
raising CliError, which cli/main.py turns into the same one-line message: no subcommand prints
its own errors or shows a traceback."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


class CliError(Exception):
    """A command cannot go on; the message names the problem and what to do."""


def add_command(subparsers, name: str, help: str, description: str | None = None,
                epilog: str | None = None) -> argparse.ArgumentParser:
    """A subcommand whose description and examples (epilog) keep their line breaks."""
    return subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def precision_budget(text: str) -> Any:
    """--precision-budget: parsed (engine/precision_auto.Budget) so a typo exits 2 at once."""
    from torch_xdna.engine.precision_auto import Budget
    try:
        return Budget.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_budget_argument(p) -> None:
    """--precision-budget, the accuracy --precision auto may give up against fp32."""
    p.add_argument("--precision-budget", type=precision_budget, default=None, metavar="SPEC",
                   help="with --precision auto: how much accuracy vs fp32 may go, e.g. "
                        "'perplexity=2%%,agreement=95%%' (decoders), 'wer=0.5%%' (Whisper, "
                        "points); the defaults are those (docs/accuracy.md)")


def add_decoder_precision(p, native_help: str) -> None:
    """--precision (native | auto | a mode) and --precision-budget of the decoder commands."""
    from torch_xdna.kernels.blocks.weights import PRECISIONS
    p.add_argument("--precision", default="native", choices=("native", "auto", *PRECISIONS),
                   help=f"weight precision (fp32 is a verification mode, not NPU numerics); "
                        f"native = {native_help}; auto = per op group (attention, MLP, head) the "
                        f"cheapest modeled precision within --precision-budget, measured once on "
                        f"a calibration text and saved beside the model")
    add_budget_argument(p)


def number(text: str, kind: type, what: str) -> Any:
    """`text` as an int or float (`kind`); an argparse error naming `what` otherwise."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a size, a count, a token budget)."""
    value = number(text, int, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give an integer >= 1")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0 = any free port)."""
    value = number(text, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give a port in 0-65535")
    return value


def seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    value = number(text, float, "a number of seconds")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; give a number of seconds > 0")
    return value


def with_stdin(items: list[str]) -> list[str]:
    """Positional texts with each '-' replaced by the non-blank lines of stdin."""
    out: list[str] = []
    for t in items:
        if t == "-":
            out.extend(line.rstrip("\n") for line in sys.stdin if line.strip())
        else:
            out.append(t)
    return out


def output_file(path: str | None, option: str) -> Path | None:
    """Check an output file's directory before a long run rather than failing after it."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if p.is_dir():
        raise CliError(f"{option} {path} is a directory; give a file name")
    if not p.parent.is_dir():
        raise CliError(f"{option} {path}: directory {p.parent} does not exist; create it first")
    return p
