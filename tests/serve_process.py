"""`xdna serve ...` as a real subprocess for the tests that need the command itself: started
with the simulator backend and no inherited key, waited for until /health answers, stopped with
SIGINT (as Ctrl-C would) when the block ends."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def xdna_serve(args: list[str], port: int, log: Path, timeout: float = 120) -> Iterator[str]:
    """`with xdna_serve(["--port", str(port)], port, log) as url:`; the output goes to `log`."""
    env = dict(os.environ, TORCH_XDNA_BACKEND="sim", PYTHONPATH=str(ROOT))
    env.pop("XDNA_API_KEY", None)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "torch_xdna.cli.main", "serve", *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"server not ready in {timeout} s:\n" + \
                log.read_text()
            time.sleep(0.25)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
