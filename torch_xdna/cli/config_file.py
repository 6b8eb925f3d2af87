"""Config files for subcommands (`xdna serve --config FILE.toml`): a TOML file whose keys are the
command's long flags without the dashes (`port = 8080`, `api-key = "..."`, `model = [...]`,
`no-default-model = true`; `api_key` spelled with underscores works too).

Each value goes through the flag's own argparse type and choices, so a file is checked exactly as
the command line is; it becomes the flag's default, so a flag given on the command line still
wins (a repeatable flag, e.g. --model, adds to the file's list). Precedence: command line > file > environment (e.g. $XDNA_API_KEY) > built-in default."""
from __future__ import annotations

import argparse
import difflib
import tomllib
from pathlib import Path
from typing import Any

from torch_xdna.cli.args import CliError

NOT_IN_FILES = ("help", "debug", "config")


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Long flag name without dashes -> its action, for the flags a file may set."""
    out = {}
    for action in parser._actions:
        for opt in action.option_strings:
            name = opt.lstrip("-")
            if opt.startswith("--") and name not in NOT_IN_FILES:
                out[name] = action
    return out


def _convert(action: argparse.Action, key: str, value: Any) -> Any:
    """`value` from the file as the command line would give it (same type, same checks)."""
    if action.nargs == 0:                              # store_true / store_false
        if not isinstance(value, bool):
            raise ValueError(f"give true or false, not {value!r}")
        return value if action.const is True else not value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_one(action, item) for item in items]
    if isinstance(value, list):
        raise ValueError("give one value, not a list")
    return _one(action, value)


def _one(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, (bool, dict, list)) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{value!r} is not a {'number' if action.type else 'string'}")
    if action.type is None and not isinstance(value, str):
        raise ValueError(f"give a string, not {value!r}")
    try:
        out = action.type(str(value)) if action.type else value
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    if action.choices is not None and out not in action.choices:
        raise ValueError(f"{out!r} is not one of {', '.join(map(str, action.choices))}")
    return out


def file_defaults(parser: argparse.ArgumentParser, path: str | Path) -> dict[str, Any]:
    """The defaults a config file sets for `parser`'s flags (dest -> value); CliError naming the
    file and key of anything wrong."""
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CliError(f"{path}: {e.strerror or e}; check the --config path") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise CliError(f"{path}: not valid TOML ({e})") from None
    options = _options(parser)
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("_", "-")
        action = options.get(name)
        if action is None:
            near = difflib.get_close_matches(name, options, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else \
                f"; the keys are the flags of `xdna {parser.prog.split()[-1]}` without '--'"
            raise CliError(f"{path}: unknown key {key!r}{hint}")
        try:
            out[action.dest] = _convert(action, key, value)
        except ValueError as e:
            raise CliError(f"{path}: {key}: {e}") from None
    return out
