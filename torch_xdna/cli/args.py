"""Argument types and the error type shared by the `xdna` subcommands.

Bad input is refused while parsing (argparse prints `xdna CMD: error: ...` and exits 2) or by
raising CliError, which cli/main.py turns into the same one-line message: no subcommand prints
its own errors or shows a traceback."""
from __future__ import annotations

import argparse
from pathlib import Path


class CliError(Exception):
    """A command cannot go on; the message names the problem and what to do."""


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a size, a count, a token budget)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; give an integer >= 1")
    return value


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0-65535 (0 = any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is out of range; give a port in 0-65535")
    return value


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
