"""`xdna completion bash|zsh`: a shell completion script made from the `xdna` parser itself
(subcommands, each one's flags, the values of flags with choices; files elsewhere), so it never
drifts from the commands and needs no completion package."""
from __future__ import annotations

import argparse
import shlex

from torch_xdna.cli.args import add_command

USAGE = """\
bash: eval "$(xdna completion bash)"   (or save it to ~/.local/share/bash-completion/completions/xdna)
zsh:  eval "$(xdna completion zsh)"    (in ~/.zshrc)"""


def register(subparsers) -> None:
    p = add_command(subparsers, "completion", help="print a shell completion script (bash, zsh)",
                    description="Print a completion script for the `xdna` command.",
                    epilog="setup:\n" + USAGE)
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=run)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]]]:
    """(flags and subcommand names offered, {flag: its choices})."""
    words, choices = list(_subparsers(parser)), {}
    for action in parser._actions:
        words += [o for o in action.option_strings if o.startswith("--")]
        if action.choices is not None and action.option_strings:
            for o in action.option_strings:
                choices[o] = [str(c) for c in action.choices]
    return words, choices


def bash_script(parser: argparse.ArgumentParser) -> str:
    commands = _subparsers(parser)
    top, top_choices = _words(parser)
    cases = [f'    "") words={shlex.quote(" ".join(top))} ;;']
    values = [f'    "{flag}") words={shlex.quote(" ".join(c))} ;;' for flag, c in top_choices.items()]
    for name, sub in commands.items():
        words, choices = _words(sub)
        cases.append(f'    {name}) words={shlex.quote(" ".join(words))} ;;')
        values += [f'    "{name} {flag}") words={shlex.quote(" ".join(c))} ;;'
                   for flag, c in choices.items()]
    values += [f'    "{name}") words={shlex.quote(" ".join(c))} ;;'
               for name, sub in commands.items()
               for flag, c in [("", _positional_choices(sub))] if c]
    return "\n".join([
        "# xdna completion (made by `xdna completion bash` from the xdna parser)",
        "_xdna() {",
        '  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} cmd="" words i',
        f'  local cmds={shlex.quote(" " + " ".join(commands) + " ")}',
        "  for ((i = 1; i < COMP_CWORD; i++)); do",
        '    case "$cmds" in *" ${COMP_WORDS[i]} "*) cmd=${COMP_WORDS[i]}; break ;; esac',
        "  done",
        '  case "$cmd" in', *cases, "  esac",
        '  local key="$prev"; [[ -n $cmd ]] && key="$cmd $prev"',
        '  [[ -n $cmd && $prev == "$cmd" && $cur != -* ]] && key="$cmd"',
        '  case "$key" in', *values,
        '    *) [[ -n $cmd && $cur != -* ]] && words="" ;;   # a path, not a flag',
        "  esac",
        '  COMPREPLY=($(compgen -W "$words" -- "$cur"))',
        '  if [[ ${#COMPREPLY[@]} -eq 0 && $cur != -* ]]; then',
        '    COMPREPLY=($(compgen -f -- "$cur"))',
        "  fi",
        "}",
        "complete -o filenames -F _xdna xdna", ""])


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    """The choices of a command's first positional (e.g. `completion bash|zsh`)."""
    for action in parser._actions:
        if not action.option_strings and action.choices is not None and \
                not isinstance(action, argparse._SubParsersAction):
            return [str(c) for c in action.choices]
    return list(_subparsers(parser))


def run(args: argparse.Namespace) -> int:
    script = bash_script(args.root_parser)      # set by cli/main.py: no import back up
    if args.shell == "zsh":          # zsh runs bash completion functions through bashcompinit
        script = "autoload -U +X bashcompinit && bashcompinit\n" + script
    print(script, end="")
    return 0
