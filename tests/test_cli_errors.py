"""`xdna` error paths: bad input gives one line `xdna CMD: error: ...` naming the problem and the
fix, exit status 2 (1 for an unexpected error), and no traceback unless --debug / XDNA_DEBUG=1."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from torch_xdna.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and stderr of `xdna argv`, argparse's SystemExit included."""
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    return code, err


def assert_one_line_error(err: str, cmd: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"xdna {cmd}: error: ")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], err


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("XDNA_DEBUG", raising=False)


@pytest.mark.parametrize("argv, needles", [
    (["generate", "/nonexistent", "hi"], ["/nonexistent", "not a directory", "pass a Hugging Face"]),
    (["embed", "--model", "/nonexistent", "hi"], ["/nonexistent", "Hugging Face model directory"]),
    (["estimate", "not-a-model"], ["not-a-model", "built-in shape", "qwen3-0.6b"]),
    (["bench", "nope"], ["unknown benchmark", "nope", "available:"]),
])
def test_bad_input_is_one_line(capsys, argv, needles):
    code, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, argv[0], *needles)


def test_model_dir_without_config(tmp_path, capsys):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    code, err = run_cli(capsys, "generate", str(tmp_path), "hi")
    assert code == 2
    assert_one_line_error(err, "generate", str(tmp_path), "no config.json")
    code, err = run_cli(capsys, "estimate", str(tmp_path))
    assert code == 2
    assert_one_line_error(err, "estimate", "no config.json")


def test_unsupported_and_corrupt_configs(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_text('{"model_type": "mamba"}')
    code, err = run_cli(capsys, "generate", str(tmp_path / "a"), "hi")
    assert code == 2
    assert_one_line_error(err, "generate", "mamba", "supported: qwen3")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").write_text("{not json")
    code, err = run_cli(capsys, "generate", str(tmp_path / "b"), "hi")
    assert code == 2
    assert_one_line_error(err, "generate", "config.json", "not valid JSON")


@pytest.mark.parametrize("argv, needles", [
    (["serve", "--port", "99999"], ["--port", "99999", "0-65535"]),
    (["profile", "--shape", "1", "2"], ["--shape", "expected 3 arguments"]),
    (["profile", "--shape", "0", "8", "8"], ["--shape", "integer >= 1"]),
    (["demo", "--hidden", "0"], ["--hidden", "integer >= 1"]),
    (["generate", "/tmp", "hi", "--max-tokens", "0"], ["--max-tokens", "integer >= 1"]),
    (["estimate", "qwen3-0.6b", "--context", "-5"], ["--context", "integer >= 1"]),
])
def test_bad_options_are_refused_while_parsing(capsys, argv, needles):
    code, err = run_cli(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, argv[0], *needles)


def test_sampling_options_checked_before_loading(tmp_path, capsys):
    # no model is read: the bad option is reported even though the directory is empty
    code, err = run_cli(capsys, "generate", str(tmp_path), "hi", "--top-p", "2")
    assert code == 2
    assert_one_line_error(err, "generate", "top_p", "(0, 1]")


def test_serve_busy_port(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, err = run_cli(capsys, "serve", "--port", str(port), "--no-default-model")
    assert code == 2
    assert_one_line_error(err, "serve", f"port {port}", "already in use", "--port")


def test_plan_error_names_the_limit(capsys):
    code, err = run_cli(capsys, "profile", "--shape", "4", "16384000", "8")
    assert code == 2
    assert_one_line_error(err, "profile", "DMA stride limit", "16384000")


def test_bench_out_directory_checked_first(tmp_path, capsys):
    code, err = run_cli(capsys, "bench", "eager", "--out", str(tmp_path / "no" / "r.json"))
    assert code == 2
    assert_one_line_error(err, "bench", "--out", "does not exist")


def test_empty_embed_text(capsys):
    code, err = run_cli(capsys, "embed", "")
    assert code == 2
    assert_one_line_error(err, "embed", "non-empty texts")


def _crash(args):
    return 1 // 0


def test_unexpected_error_has_no_traceback_unless_debug(monkeypatch, capsys):
    import torch_xdna.cli.npu.info as info
    monkeypatch.setattr(info, "run", _crash)
    code, err = run_cli(capsys, "info")
    assert code == 1
    assert_one_line_error(err, "info", "unexpected ZeroDivisionError", "--debug")
    code, err = run_cli(capsys, "info", "--debug")
    assert code == 1 and "Traceback" in err and "ZeroDivisionError" in err
    code, err = run_cli(capsys, "--debug", "info")
    assert code == 1 and "Traceback" in err
    monkeypatch.setenv("XDNA_DEBUG", "1")
    code, err = run_cli(capsys, "info")
    assert code == 1 and "Traceback" in err


def test_debug_shows_traceback_of_user_errors(capsys):
    code, err = run_cli(capsys, "--debug", "estimate", "not-a-model")
    assert code == 2 and "Traceback" in err
    assert err.rstrip().splitlines()[-1].startswith("xdna estimate: error: ")


def test_subprocess_exit_code_and_stderr():
    env = {k: v for k, v in os.environ.items() if k != "XDNA_DEBUG"}
    env["TORCH_XDNA_BACKEND"] = "sim"
    p = subprocess.run([sys.executable, "-m", "torch_xdna.cli.main", "generate", "/nonexistent",
                        "hi"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == ("xdna generate: error: /nonexistent: not a directory; pass a "
                                "Hugging Face model directory")
