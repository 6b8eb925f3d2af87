"""The simulator's host lanes (runtime/sim/lanes.py): independent embedding batches of one step
run on two host threads, while the modeled NPU (time, counters, order) stays that of sequential
runs and every vector stays bit-identical and batch-invariant."""
from __future__ import annotations

import pytest
import torch

from torch_xdna.engine.embed.embedder import EmbedStats, Embedder
from torch_xdna.runtime import get_device
from torch_xdna.runtime.sim.device import SimDevice
from torch_xdna.runtime.sim.lanes import HostLanes, check_independent, default_host_lanes

pytestmark = pytest.mark.usefixtures("one_thread")

# short and long inputs, so one call plans several batches, two of them the same shape
TEXTS = ["hello world", "a", "the cat sat on the mat", "x y z", "What time is it?",
         "Embeddings map text to vectors that capture what a sentence means, so that similar "
         "sentences land close together and a search can find them by meaning.",
         "The NPU runs the encoder in one chained program per batch; the host only tokenizes.",
         "Grüße aus Köln!", "🚀 launch", "one two three four five six seven eight nine ten"]


@pytest.fixture(scope="module")
def emb():
    base = get_device()
    dev = SimDevice(base.gen, base.memory_budget)       # a private device: lanes set freely
    # max_batch 2: ten inputs make five batches, several of one (batch, seq) shape
    e = Embedder.load(device=dev, max_batch=2)
    yield e
    e.close()
    dev.close()


def _run(e: Embedder, lanes: int, seqs: list[list[int]]) -> tuple[torch.Tensor, EmbedStats, dict]:
    e.dev.set_host_lanes(lanes)
    before = e.dev.counters.snapshot()
    stats = EmbedStats()
    vecs = e.embed_ids(seqs, stats)
    after = e.dev.counters.snapshot()
    return vecs, stats, {k: after[k] - before[k] for k in ("launches", "dispatches", "programs",
                                                           "dram_bytes", "bytes_to_device",
                                                           "bytes_from_device")}


def test_lanes_change_neither_vectors_nor_the_modeled_npu(emb):
    seqs = emb.tokenize(TEXTS)
    shapes = [(len(b), max(len(seqs[i]) for i in b)) for b in emb.plan_batches(
        [len(s) for s in seqs])]
    assert len(shapes) >= 3
    _run(emb, 2, seqs)                                   # build the per-lane workspaces
    runs0 = emb.dev.lane_runs
    seq_v, seq_s, seq_c = _run(emb, 1, seqs)
    lane_v, lane_s, lane_c = _run(emb, 2, seqs)
    assert emb.dev.lane_runs == runs0 + 1                # the lanes path did run
    assert torch.equal(seq_v, lane_v)
    assert lane_c == seq_c
    assert lane_s.shapes == seq_s.shapes and lane_s.processed_tokens == seq_s.processed_tokens
    assert lane_s.modeled_us == pytest.approx(seq_s.modeled_us, rel=1e-12)
    # batch invariance across lanes: each input alone gives the same bits
    for i in (0, 5, 9):
        alone, _, _ = _run(emb, 1, [seqs[i]])
        assert torch.equal(alone[0], lane_v[i]), TEXTS[i]


def test_many_repeated_calls_stay_identical(emb):
    """Concurrent lanes over many calls: no workspace or cache is shared by two running batches."""
    seqs = emb.tokenize(TEXTS)
    want, _, _ = _run(emb, 1, seqs)
    emb.dev.set_host_lanes(2)
    for k in range(4):
        order = seqs[k:] + seqs[:k]                      # other partners, other batch cuts
        got = emb.embed_ids(order)
        assert torch.equal(got, torch.cat([want[k:], want[:k]]))


def test_run_programs_refuses_programs_sharing_a_buffer(emb):
    emb.dev.set_host_lanes(2)
    ws = emb._workspace(2, 8)
    with pytest.raises(ValueError, match="writes a buffer that program 1"):
        check_independent([ws.program, ws.program])
    with pytest.raises(ValueError, match="own workspace"):
        emb.dev.run_programs([ws.program, ws.program])


def test_host_lanes_report_each_failure_in_order():
    lanes = HostLanes(2)
    try:
        def boom():
            raise RuntimeError("lane failure")
        errs = lanes.run([lambda: None, boom, lambda: None], [1.0, 3.0, 2.0])
        assert errs[0] is None and errs[2] is None and isinstance(errs[1], RuntimeError)
    finally:
        lanes.close()
    with pytest.raises(ValueError, match="host lanes must be >= 1"):
        HostLanes(0)
    assert 1 <= default_host_lanes() <= 2
