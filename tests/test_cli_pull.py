"""`xdna pull` against a local HTTP server speaking the Hub API (tests/fake_hub.py) through
HF_ENDPOINT: the model is downloaded with a progress bar and then served; a pull killed mid-file
resumes with a Range request for the rest. Nothing leaves the machine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_hub import FakeHub  # noqa: E402

REPO = "tiny-org/tiny-qwen3"


def _pull(hub: FakeHub, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
           "HF_HOME": str(tmp / "hf-home"), "XDG_DATA_HOME": str(tmp / "data"),
           "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.run([sys.executable, "-m", "torch_xdna.cli.main", "pull", REPO, *args],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    import client_fixtures as cf
    return cf.build_qwen(tmp_path_factory.mktemp("hub") / "tiny-qwen3")


def test_pull_downloads_and_serves(source, tmp_path):
    with FakeHub(REPO, source, cut_after=65536) as hub:     # the connection drops mid-file
        done = _pull(hub, tmp_path)
        assert done.returncode == 2 and "run the same command again to resume" in done.stderr
        done = _pull(hub, tmp_path)                          # ... and the next run resumes
    assert done.returncode == 0, done.stderr
    assert ("model.safetensors", "bytes=65536-") in hub.ranges
    dest = tmp_path / "data" / "torch-xdna" / "models" / "tiny-qwen3"
    assert done.stdout.strip() == str(dest)
    assert "100%" in done.stderr and "model.safetensors" in done.stderr    # the progress bars
    for name, data in hub.files.items():
        assert (dest / name).read_bytes() == data
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    app = create_app(ServerConfig(default_model=False, models=[f"chat={dest}"]))
    with BackgroundServer(app) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        r = c.chat.completions.create(model="chat", max_tokens=3, temperature=0,
                                      messages=[{"role": "user", "content": "hello"}])
        assert r.usage.completion_tokens >= 1


def test_an_interrupted_pull_resumes(tmp_path):
    """The first run is killed mid-file (the network hangs); the second asks for the rest only.
    The file is 4 MiB and the network hangs after 2 MiB."""
    import time
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "config.json").write_text("{}")
    (repo / "model.gguf").write_bytes(os.urandom(4 << 20))
    dest = tmp_path / "out"
    env = {**os.environ, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf-home")}
    with FakeHub(REPO, repo, cut_after=2 << 20, stall=True) as hub:
        env["HF_ENDPOINT"] = hub.url
        cmd = [sys.executable, "-m", "torch_xdna.cli.main", "pull", REPO, "--dir", str(dest)]
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        part = []
        while time.monotonic() < deadline and not part:
            part = [p for p in dest.rglob("*.part") if p.stat().st_size >= 1 << 20]
            time.sleep(0.1)
        first.kill()
        first.communicate()
        assert part, "the first pull never wrote a partial file"
        size = part[0].stat().st_size
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert ("model.gguf", f"bytes={size}-") in hub.ranges          # only the rest was asked for
    assert (dest / "model.gguf").read_bytes() == (repo / "model.gguf").read_bytes()


def test_pull_errors_are_one_line(tmp_path, source):
    with FakeHub(REPO, source) as hub:
        bad = subprocess.run([sys.executable, "-m", "torch_xdna.cli.main", "pull", "no-slash"],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and "OWNER/NAME" in bad.stderr
        env_repo = "tiny-org/other"
        r = subprocess.run([sys.executable, "-m", "torch_xdna.cli.main", "pull", env_repo],
                           env={**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0",
                                "HF_HOME": str(tmp_path / "h"),
                                "XDG_DATA_HOME": str(tmp_path / "d")},
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "no such repository" in r.stderr
        assert len(r.stderr.strip().splitlines()[-1]) < 300
