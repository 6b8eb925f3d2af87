"""`xdna serve --config FILE.toml`: the file's keys are the flags (same types and checks), a flag
on the command line wins, mistakes are one line naming file and key; a real `xdna serve` started
from a file serves what the file says."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from torch_xdna.cli import main as cli_main
from torch_xdna.cli.jobs import serve

sys.path.insert(0, str(Path(__file__).parent))
from serve_process import ROOT, free_port, xdna_serve  # noqa: E402
FLAGS = ["--host", "0.0.0.0", "--port", "8123", "--api-key", "k3y", "--model", "chat=/m/qwen",
         "--model", "/m/bge", "--alias", "gpt-4o=chat", "--no-default-model", "--max-queue", "9",
         "--gather-ms", "5.5", "--kv-dtype", "int8", "--cors-origin", "*", "--max-context", "64",
         "--graceful-timeout", "2.5", "--log-level", "warning", "--no-preload"]
TOML = """\
host = "0.0.0.0"
port = 8123
api-key = "k3y"
model = ["chat=/m/qwen", "/m/bge"]
alias = "gpt-4o=chat"
no_default_model = true
max-queue = 9
gather-ms = 5.5
kv-dtype = "int8"
cors-origin = ["*"]
max-context = 64
graceful-timeout = 2.5
log-level = "warning"
no-preload = true
"""


@pytest.fixture
def parsed(monkeypatch):
    """Run `xdna serve ...` up to its run(): the namespace it would get."""
    got = []
    monkeypatch.setattr(serve, "run", lambda args: got.append(args) or 0)

    def parse(*argv: str):
        assert cli_main.main(["serve", *argv]) == 0
        return {k: v for k, v in vars(got.pop()).items() if k not in ("config", "config_parser")}
    return parse


def test_file_keys_are_the_flags(parsed, tmp_path):
    f = tmp_path / "serve.toml"
    f.write_text(TOML)
    assert parsed("--config", str(f)) == parsed(*FLAGS)
    assert parsed("--config", str(f))["max_queue"] == 9 != parsed()["max_queue"]


def test_command_line_wins_over_the_file(parsed, tmp_path, monkeypatch):
    f = tmp_path / "serve.toml"
    f.write_text('port = 8123\napi-key = "from-file"\nmodel = ["a"]\n')
    monkeypatch.setenv("XDNA_API_KEY", "from-env")
    args = parsed("--port", "9001", "--config", str(f), "--model", "b")
    assert (args["port"], args["api_key"]) == (9001, "from-file")
    assert args["model"] == ["a", "b"]             # a repeatable flag adds to the file's list
    assert parsed("--config", str(f), "--api-key", "flag")["api_key"] == "flag"
    assert parsed()["api_key"] == "from-env"


@pytest.mark.parametrize("text,message", [
    ("prot = 8000", "unknown key 'prot'; did you mean 'port'?"),
    ("zzz = 1", "unknown key 'zzz'; the keys are the flags of `xdna serve` without '--'"),
    ('port = "x"', "port: 'x' is not a port number"),
    ("port = 70000", "port: 70000 is out of range"),
    ("port = true", "port: True is not a number"),
    ('no-default-model = "yes"', "no-default-model: give true or false, not 'yes'"),
    ('kv-dtype = "fp8"', "kv-dtype: 'fp8' is not one of bf16, int8"),
    ("host = 1", "host: give a string, not 1"),
    ("port = [1, 2]", "port: give one value, not a list"),
    ('config = "other.toml"', "unknown key 'config'"),
    ("port = ", "not valid TOML"),
])
def test_mistakes_are_one_line(text, message, tmp_path, capsys):
    f = tmp_path / "bad.toml"
    f.write_text(text + "\n")
    assert cli_main.main(["serve", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"xdna serve: error: {f}: ") and message in err, err
    assert err.count("\n") == 1


def test_missing_file(tmp_path, capsys):
    assert cli_main.main(["serve", "--config", str(tmp_path / "none.toml")]) == 2
    err = capsys.readouterr().err
    assert "none.toml: No such file or directory; check the --config path" in err


def test_xdna_serve_from_a_file(tmp_path):
    from llm_fixtures import build_model
    build_model("qwen3", tmp_path / "tiny-qwen3")
    port = free_port()
    f = tmp_path / "serve.toml"
    f.write_text(f'port = {port}\napi-key = "k3y"\nno-default-model = true\n'
                 f'model = ["chat={tmp_path / "tiny-qwen3"}"]\nalias = ["gpt-4o=chat"]\n'
                 f'max-context = 64\nlog-level = "warning"\n')
    log = tmp_path / "serve.log"
    with xdna_serve(["--config", str(f)], port, log) as url:
        assert httpx.get(url + "/v1/models").status_code == 401
        cards = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k3y"}).json()
        assert [(c["id"], c.get("aliases"), c["max_model_len"]) for c in cards["data"]] == \
            [("chat", ["gpt-4o"], 64)]
    assert " INFO " not in log.read_text()            # log-level from the file


def test_log_level_on_every_command(parsed):
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert [n for n, sp in sub.choices.items() if "--log-level" not in sp._option_string_actions] \
        == []
    assert parsed()["log_level"] == "info"                       # serve's default
    assert parsed("--log-level", "debug")["log_level"] == "debug"
    assert cli_main.main(["--log-level", "warning", "serve"]) == 0   # before the command too


def test_log_lines_are_timestamped():
    """Another command than serve: `xdna info --log-level debug` logs the backend probe."""
    proc = subprocess.run([sys.executable, "-m", "torch_xdna.cli.main", "info", "--log-level",
                           "debug"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, TORCH_XDNA_BACKEND="auto", PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} DEBUG torch_xdna", ln)
                         for ln in lines), proc.stderr


def test_docs_examples_parse(tmp_path):
    """docs/serving.md: the TOML example, the systemd unit's ExecStart and the Containerfile's
    command go through `xdna serve`'s own parser (a wrong example fails here)."""
    import json
    import shlex
    from torch_xdna.cli.config_file import file_defaults
    text = (ROOT / "docs" / "serving.md").read_text()
    f = tmp_path / "serve.toml"
    f.write_text(re.search(r"```toml\n(.*?)```", text, re.S).group(1))
    parser = cli_main.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    values = file_defaults(sub.choices["serve"], f)
    assert values["model"][0] == "chat=/srv/models/Qwen3-0.6B" and values["no_default_model"]
    exec_start = shlex.split(re.search(r"^ExecStart=(.*)$", text, re.M).group(1))
    assert parser.parse_args(exec_start[1:]).config == "/etc/xdna/serve.toml"
    cmd = re.search(r"^ENTRYPOINT (\[.*\])\nCMD (\[.*\])$", text, re.M)
    args = parser.parse_args(json.loads(cmd.group(1))[1:] + json.loads(cmd.group(2)))
    assert (args.command, args.host, args.config) == ("serve", "0.0.0.0", "/etc/xdna/serve.toml")
