"""`xdna completion bash|zsh`: the script made from the parser completes subcommands, flags, flag
values and paths in a real bash (COMP_WORDS set as bash's completion would)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from torch_xdna.cli.main import main

CASES = [(["xdna", "se"], "serve selftest"),
         (["xdna", "serve", "--kv"], "--kv-dtype"),
         (["xdna", "serve", "--kv-dtype", ""], "bf16 int8"),
         (["xdna", "--log-level", "debug", "ch"], "chat"),
         (["xdna", "chat", "--no-th"], "--no-think"),
         (["xdna", "completion", ""], "bash zsh"),
         (["xdna", "generate", "--precision", "in"], "int8 int4"),
         (["xdna", "chat", "{d}/mo"], "{d}/model.gguf"),
         (["xdna", "serve", "--config", "{d}/s"], "{d}/serve.toml")]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
def test_bash_completes(tmp_path, capsys):
    (tmp_path / "model.gguf").touch()
    (tmp_path / "serve.toml").touch()
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "xdna.bash"
    script.write_text(capsys.readouterr().out)
    lines = [f"source {script}",
             't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMPREPLY=(); '
             '_xdna; echo "${COMPREPLY[*]}"; }']
    for words, _ in CASES:
        lines.append("t " + " ".join(f'"{w.format(d=tmp_path)}"' for w in words))
    out = subprocess.run(["bash", "--norc", "-c", "\n".join(lines)], capture_output=True,
                         text=True, timeout=30, check=True).stdout.splitlines()
    assert out == [want.format(d=tmp_path) for _, want in CASES]


def test_zsh_script_loads_bashcompinit(capsys):
    assert main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert "complete -o filenames -F _xdna xdna" in out
