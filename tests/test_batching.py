"""Continuous batching: each sequence's greedy tokens equal its tokens decoded alone, with
sequences joining and leaving between steps; the batched step streams the weights once."""
from __future__ import annotations

import pytest
import torch

from llm_fixtures import build_model
from torch_xdna.engine.llm.batching import BatchRunner, BatchSession, SessionFull
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3b")
    build_model("qwen3", path, seed=5)
    eng = load_decoder(path, "bf16", max_context=128, quiet=True, prefix_cache=0)
    yield eng
    eng.close()


def _prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(5, 390, (n,), generator=g).tolist() for n in (7, 19, 3, 30)]


def test_batched_tokens_equal_alone_with_joins_and_leaves(engine):
    prompts = _prompts()
    lens = (6, 3, 8, 5)                         # different lengths: sequences leave at different steps
    alone = [engine.complete(p, GenerationConfig(max_tokens=m, stop_token_ids=())).token_ids
             for p, m in zip(prompts, lens)]
    with BatchSession(engine, slots=3) as session:
        seqs = [session.add(p, GenerationConfig(max_tokens=m, stop_token_ids=()))
                for p, m in zip(prompts[:3], lens[:3])]
        with pytest.raises(SessionFull):
            session.add(prompts[3])
        session.step()
        session.step()
        assert [n for n, _ in session.modeled_step_us] == [3, 3]
        assert seqs[1].finish_reason == "length"     # its 3rd token came from the 2nd step: it left
        seqs.append(session.add(prompts[3], GenerationConfig(max_tokens=lens[3], stop_token_ids=())))
        session.run()
        sizes = [n for n, _ in session.modeled_step_us]
        assert sizes[2] == 3 and sizes[-1] == 1      # the joiner filled the slot; then they leave
    assert [s.token_ids for s in seqs] == alone
    assert all(s.finish_reason == "length" for s in seqs)
    assert engine.complete(prompts[0], GenerationConfig(max_tokens=2)).usage   # lock released


def test_batched_step_streams_weights_once(engine):
    prompts = _prompts()
    cfg = GenerationConfig(max_tokens=4, stop_token_ids=())
    per_n = {}
    for n in (1, 3):
        with BatchSession(engine, slots=3) as session:
            for p in prompts[:n]:
                session.add(p, cfg)
            session.step()                      # loads the program
            session.step()
            per_n[n] = session.modeled_step_us[-1][1]
    # modeled: three sequences cost far less than three batch-1 steps (weights stream once)
    assert per_n[3] < 1.5 * per_n[1]


def test_runner_concurrent_callers_join_the_running_batch(engine):
    import concurrent.futures as cf
    import queue
    import threading
    prompts = _prompts()
    cfg = GenerationConfig(max_tokens=5, stop_token_ids=())
    alone = [engine.complete(p, cfg).token_ids for p in prompts]
    runner = BatchRunner(engine, slots=2)          # 4 callers, 2 slots: two join mid-run
    jobs: queue.Queue = queue.Queue()              # stands in for the server's DeviceWorker

    def device():
        while (job := jobs.get()) is not None:
            job()

    worker = threading.Thread(target=device)
    worker.start()
    gate = threading.Barrier(len(prompts))

    def call(p):
        gate.wait()
        h, start = runner.submit(p, cfg)
        if start:
            jobs.put(runner.drive)
        return h.result(), h.finish_reason

    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        got = list(ex.map(call, prompts))
    jobs.put(None)
    worker.join()
    assert [t for t, _ in got] == alone and {r for _, r in got} == {"length"}
    assert runner.max_batch == 2
    h, start = runner.submit([10_000], cfg)        # a bad prompt fails its own caller only
    assert start
    runner.drive()
    with pytest.raises(ValueError, match="vocabulary"):
        h.result()


def test_token_ids_streamed_once_without_tokenizer(engine):
    tok, engine.tokenizer = engine.tokenizer, None
    try:
        r = engine.complete([5, 6, 7], GenerationConfig(max_tokens=4, stop_token_ids=()))
        assert len(r.token_ids) == 4
    finally:
        engine.tokenizer = tok


def test_runner_yields_to_waiting_device_work_then_resumes(engine):
    prompts = _prompts()
    cfg = GenerationConfig(max_tokens=3, stop_token_ids=())
    alone = [engine.complete(p, cfg).token_ids for p in prompts[:3]]
    waiting = {"jobs": 0}
    runner = BatchRunner(engine, slots=lambda: 2, yield_to=lambda: waiting["jobs"] > 0)
    handles = [runner.submit(p, cfg)[0] for p in prompts[:3]]
    waiting["jobs"] = 1                      # another job waits: admit no one after round one
    assert runner.drive() is True            # the first two ran to the end; the third waits
    assert [h.finished for h in handles] == [True, True, False] and runner.queued == 1
    waiting["jobs"] = 0
    h, start = runner.submit(prompts[0], cfg)
    assert not start                         # a drive is still owed: the caller re-queues it
    assert runner.drive() is False and runner.queued == 0
    assert [x.result() for x in handles] == alone and h.result() == alone[0]
    r0 = BatchRunner(engine, slots=0)        # no slot fits: served alone, same tokens
    hs = [r0.submit(p, cfg)[0] for p in prompts[:2]]
    assert r0.drive() is False and r0.alone == 2 and [x.result() for x in hs] == alone[:2]


def test_runner_cancelled_while_queued_never_prefills(engine):
    prompts = _prompts()
    cfg = GenerationConfig(max_tokens=3, stop_token_ids=())
    runner = BatchRunner(engine, slots=1)
    first, _ = runner.submit(prompts[0], cfg)
    queued, _ = runner.submit(prompts[1], cfg)      # waits for the only slot
    queued.cancel()                                 # its client left while it waited
    assert runner.drive() is False
    assert len(first.result()) == 3 and queued.result() == []
    assert queued.finish_reason == "cancelled" and queued.seq is None
