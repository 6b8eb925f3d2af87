"""/v1/embeddings with the simulator's host lanes (xdna serve --host-threads): concurrent clients'
merged steps run their batches on two host threads, and every client still gets exactly its own
vectors, bit-identical to single-request vectors from the engine."""
from __future__ import annotations

import random
import threading

import httpx
import pytest
import torch

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.registry import ModelRegistry

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["hello world", "a", "What time is it?", "Grüße aus Köln!", "🚀 launch",
         "Embeddings map text to vectors that capture what a sentence means, so that similar "
         "sentences land close together and a search can find them by meaning.",
         "The NPU runs the encoder in one chained program per batch; the host only tokenizes "
         "the request, waits for the device step and encodes the vectors as JSON.",
         "one two three four five six seven eight nine ten eleven twelve",
         " ".join(f"word{i} of a longer passage" for i in range(30))]


@pytest.fixture(scope="module")
def live():
    reg = ModelRegistry(max_models=1)
    reg.add_default_embedding()
    app = create_app(ServerConfig(host_threads=2), registry=reg)
    srv = app.state.server
    try:
        with BackgroundServer(app) as bg:
            yield bg, srv
    finally:
        srv.dev.set_host_lanes(1)          # the process-wide device: back to the default


def test_concurrent_clients_get_their_own_vectors_on_two_lanes(live):
    bg, srv = live
    assert srv.dev.host_lanes == 2
    emb = srv.registry.loaded["all-MiniLM-L6-v2"]
    srv.dev.set_host_lanes(1)
    expected = {t: emb.embed([t])[0] for t in TEXTS}    # one request each, sequential
    srv.dev.set_host_lanes(2)
    runs0 = srv.dev.lane_runs
    errors: list[str] = []
    merged: list[int] = []
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=bg.url, timeout=120) as http:
            for _ in range(4):
                texts = rng.sample(TEXTS, rng.randint(2, 5))
                r = http.post("/v1/embeddings", json={"input": texts})
                with lock:
                    if r.status_code != 200:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                        continue
                    merged.append(int(r.headers["x-xdna-merged-requests"]))
                    for t, d in zip(texts, r.json()["data"]):
                        if not torch.equal(torch.tensor(d["embedding"]), expected[t]):
                            errors.append(f"wrong vector for {t[:30]!r}")

    threads = [threading.Thread(target=client, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:5]
    assert len(merged) == 16
    assert srv.dev.lane_runs > runs0                     # merged steps ran on the lanes
    assert max(merged) >= 2                              # and clients did share steps


def test_serve_host_threads_option_parses_and_validates(capsys):
    from torch_xdna.cli.main import build_parser
    p = build_parser()
    assert p.parse_args(["serve", "--host-threads", "3"]).host_threads == 3
    assert p.parse_args(["serve"]).host_threads is None          # default: default_host_lanes()
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--host-threads", "0"])
    assert "--host-threads" in capsys.readouterr().err
