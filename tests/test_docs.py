"""The README and docs/*.md stay true: every ```python block runs (on the simulator, in a fresh
subprocess, under a timeout) unless the line before it says why it cannot run here, and every
`xdna ...` command line in a shell block parses with the real CLI.

Markers, an HTML comment on the line right before the block (invisible when rendered, visible
in the source):
  <!-- doctest: skip (needs a running server) -->    not run; the reason is required
  <!-- doctest: fixture tiny-qwen3 -->               run after building a tiny random-weight
                                                     Qwen3 directory and pointing /tmp/tiny-qwen3
                                                     at it (what the doc's shell block builds)
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^\s*<!--\s*doctest:\s*(?P<kind>\w+)\s*(?P<arg>.*?)\s*-->\s*$")
FIXTURES = {"tiny-qwen3": "/tmp/tiny-qwen3"}     # name -> the path the doc uses
SHELL_LANGS = ("bash", "sh", "console", "shell")
TIMEOUT_S = 240


@dataclass
class Block:
    path: Path
    line: int            # 1-based line of the opening fence
    lang: str
    code: str
    marker: re.Match | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```\s*(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marker = MARKER.match(lines[start - 1]) if start > 0 else None
        out.append(Block(path, start + 1, m.group(1).lower(), "\n".join(body) + "\n", marker))
        i += 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang == "python"]


def test_docs_found():
    assert len(DOCS) >= 6 and len(PYTHON) >= 8


def test_markers_are_well_formed():
    """A marker sits right above a python block and says why (skip) or names a known fixture."""
    for path in DOCS:
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            m = MARKER.match(line)
            if not m:
                continue
            where = f"{path.relative_to(ROOT)}:{n + 1}"
            assert n + 1 < len(lines) and lines[n + 1].strip() == "```python", \
                f"{where}: a doctest marker must be on the line right before a ```python block"
            if m["kind"] == "skip":
                assert re.fullmatch(r"\(.+\)", m["arg"]), f"{where}: give the reason: skip (why)"
            else:
                assert m["kind"] == "fixture" and m["arg"] in FIXTURES, f"{where}: {line.strip()}"


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from llm_fixtures import build_model
    d = tmp_path_factory.mktemp("docs") / "tiny-qwen3"
    build_model("qwen3", d)
    return d


@pytest.mark.parametrize("block", PYTHON, ids=lambda b: b.id)
def test_python_block_runs(block: Block, request, tmp_path):
    code = block.code
    if block.marker is not None:
        kind, arg = block.marker["kind"], block.marker["arg"]
        if kind == "skip":
            pytest.skip(f"marked in the doc: skip {arg}")
        code = code.replace(FIXTURES[arg], str(request.getfixturevalue(arg.replace("-", "_"))))
    env = dict(os.environ, TORCH_XDNA_BACKEND="sim", TORCH_XDNA_FALLBACK="warn",
               TORCH_XDNA_CACHE_DIR=str(tmp_path / "cache"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("TORCH_XDNA_MEMORY_BUDGET", None)
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id}: did not finish in {TIMEOUT_S} s")
    assert p.returncode == 0, f"{block.id} failed:\n{code}\n--- stderr:\n{p.stderr[-4000:]}"


# ---- shell examples against the real CLI ----------------------------------------------------

def xdna_commands(block: Block) -> list[list[str]]:
    """`xdna ...` invocations in a shell block (prompts, pipes, redirects, comments removed)."""
    text = re.sub(r"\\\n\s*", " ", block.code)          # join continued lines
    cmds = []
    for line in text.splitlines():
        line = line.strip()
        if block.lang == "console":                       # only prompt lines are commands
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if "xdna " not in line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        cmd: list[str] = []
        for w in words + ["|"]:
            if w in ("|", "&&", ";") or w.startswith(">") or w.startswith("<"):
                if cmd and cmd[0] == "xdna":
                    cmds.append(cmd[1:])
                cmd = [] if w in ("|", "&&", ";") else [">"]
            elif cmd != [">"]:
                cmd.append(w)
    return cmds


SHELL_CMDS = [(b, c) for b in ALL if b.lang in SHELL_LANGS for c in xdna_commands(b)]


def test_shell_examples_found():
    subcommands = {c[0] for _, c in SHELL_CMDS if c}
    assert {"serve", "embed", "generate", "estimate", "doctor"} <= subcommands


@pytest.mark.parametrize("block, argv", SHELL_CMDS,
                         ids=[f"{b.id}:{' '.join(c[:2])}" for b, c in SHELL_CMDS])
def test_shell_example_parses(block: Block, argv: list[str]):
    from torch_xdna.cli.main import build_parser
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{block.id}: `xdna {' '.join(argv)}` is refused by the CLI: "
                        f"{err.getvalue().strip()} (exit {e.code})")
    assert isinstance(args, argparse.Namespace) and args.command == argv[0]
