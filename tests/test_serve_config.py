"""`xdna serve --config FILE.toml`: the file's keys are the flags (same types and checks), a flag
on the command line wins, mistakes are one line naming file and key; a real `xdna serve` started
from a file serves what the file says."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from torch_xdna.cli import main as cli_main
from torch_xdna.cli.jobs import serve

sys.path.insert(0, str(Path(__file__).parent))
from serve_process import free_port, xdna_serve  # noqa: E402
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
