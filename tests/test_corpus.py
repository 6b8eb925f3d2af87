"""Corpus jobs (`xdna embed --input/--output`, engine/embed/corpus.py): 20k short texts on this
machine vs transformers on CPU, the three input formats and their ids, a job SIGKILLed mid-run
then resumed == an uninterrupted run, refusal to resume onto a changed input, and the same job
through Ray Data on a local 2-CPU Ray instance giving the identical parquet."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from torch_xdna.engine.embed.corpus import (TEST_KILL_ENV, CorpusError, CorpusJob, _Parts,  # noqa: E402
                                      partial_dir, run_job)
from torch_xdna.engine.embed.embedder import Embedder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_TEXTS = 20_000
ROWS = 2048                              # lines per chunk / row group



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random BERT with a 115-word WordPiece vocabulary (fast embedding-table reads)."""
    from transformers import BertConfig, BertModel
    d = tmp_path_factory.mktemp("tiny-bert")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(100)] + \
        [str(i) for i in range(10)]
    (d / "vocab.txt").write_text("\n".join(words) + "\n")
    cfg = BertConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=1,
                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(d)
    return d


def _text(rng: random.Random) -> str:
    return " ".join(f"w{rng.randrange(100)}" for _ in range(rng.randint(1, 12)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """20k jsonl records with string ids, two blank lines and one text longer than the model."""
    rng = random.Random(0)
    p = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    texts = [_text(rng) for _ in range(N_TEXTS)]
    texts[5] = " ".join(["w1"] * 40)                     # > 32 positions: truncated
    with open(p, "w") as f:
        for i, t in enumerate(texts):
            if i in (3, 4000):
                f.write("\n")
            f.write(json.dumps({"id": f"doc-{i}", "text": t, "lang": "xx"}) + "\n")
    return p, texts


@pytest.fixture(scope="module")
def embedder(model_dir, one_thread):
    emb = Embedder.load(model_dir, max_batch=256)
    yield emb
    emb.close()


@pytest.fixture(scope="module")
def reference(corpus, embedder, model_dir, tmp_path_factory):
    """The uninterrupted local run over the 20k corpus."""
    out = tmp_path_factory.mktemp("ref") / "ref.parquet"
    s = run_job(CorpusJob(corpus[0], out, model=str(model_dir), batch_size=256,
                          rows_per_group=ROWS), embedder_factory=lambda: embedder)
    return out, s


def test_local_20k_matches_transformers(reference, corpus, model_dir):
    out, s = reference
    texts = corpus[1]
    t = pq.read_table(out)
    assert (s.rows, t.num_rows, s.runner, s.id_type) == (N_TEXTS, N_TEXTS, "local", "string")
    assert t.column("id").to_pylist() == [f"doc-{i}" for i in range(N_TEXTS)]
    assert t.schema.field("embedding").type == pa.list_(pa.float32(), 16)
    assert t.schema.metadata[b"model"] == s.model.encode() and t.schema.metadata[b"dimensions"] == b"16"
    lines = N_TEXTS + 2
    assert pq.ParquetFile(out).metadata.num_row_groups == -(-lines // ROWS)   # one per chunk
    assert not partial_dir(out).exists()
    assert s.truncated == 1 and t.column("truncated").to_pylist()[5]
    # reference: transformers BertModel on CPU, mean pooling + L2 norm (a plain HF folder)
    from transformers import BertModel
    from tokenizers.implementations import BertWordPieceTokenizer
    hf = BertModel.from_pretrained(model_dir).eval()
    tok = BertWordPieceTokenizer(str(model_dir / "vocab.txt"))
    vecs = torch.tensor(t.column("embedding").to_pylist()[:64])
    for i in range(64):
        ids = tok.encode(texts[i]).ids[:32]
        if len(ids) == 32:
            ids[-1] = 3                                   # [SEP] kept last on truncation
        with torch.no_grad():
            h = hf(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
        cos = torch.nn.functional.cosine_similarity(vecs[i], h, dim=0)
        assert cos > 0.999, (i, float(cos))
        torch.testing.assert_close(vecs[i], h / h.norm(), atol=2e-2, rtol=2e-2)


def test_txt_and_parquet_inputs_carry_ids(tmp_path, embedder, model_dir):
    rng = random.Random(1)
    texts = [_text(rng) for _ in range(300)]
    txt = tmp_path / "c.txt"
    txt.write_text("\n".join(texts[:10]) + "\n\n  \n" + "\n".join(texts[10:]))  # no final \n
    a = run_job(CorpusJob(txt, tmp_path / "a.parquet", model=str(model_dir), rows_per_group=64),
                embedder_factory=lambda: embedder)
    ta = pq.read_table(tmp_path / "a.parquet")
    assert a.rows == 300 and ta.column("id").to_pylist() == list(range(1, 11)) + list(range(13, 303))
    src = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": texts, "key": [1000 + i for i in range(300)]}), src,
                   row_group_size=50)                    # chunks span input row groups
    run_job(CorpusJob(src, tmp_path / "b.parquet", model=str(model_dir), text_field="body",
                      id_field="key", rows_per_group=64), embedder_factory=lambda: embedder)
    tb = pq.read_table(tmp_path / "b.parquet")
    assert tb.column("id").to_pylist() == [1000 + i for i in range(300)]
    assert tb.column("embedding").equals(ta.column("embedding"))   # same texts, same vectors
    with pytest.raises(CorpusError, match="no column 'text'"):
        run_job(CorpusJob(src, tmp_path / "c.parquet.parquet", model=str(model_dir)),
                embedder_factory=lambda: embedder)


def test_killed_then_resumed_equals_uninterrupted(reference, corpus, model_dir, embedder,
                                                  tmp_path):
    """A CLI job SIGKILLed after 3 committed chunks, then rerun (in-process, to save a second
    interpreter start): the same parquet, bit for bit."""
    out = tmp_path / "resumed.parquet"
    args = [sys.executable, "-m", "torch_xdna.cli.main", "embed", "--input", str(corpus[0]),
            "--output", str(out), "--model", str(model_dir), "--batch-size", "256",
            "--row-group-size", str(ROWS), "--json"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **{TEST_KILL_ENV: "3"})
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stderr
    m = json.loads((partial_dir(out) / "manifest.json").read_text())
    assert m["chunks_done"] == 3 and m["rows"] == 3 * ROWS - 2 and not out.exists()
    s = run_job(CorpusJob(corpus[0], out, model=str(model_dir), batch_size=256,
                          rows_per_group=ROWS), embedder_factory=lambda: embedder)
    assert (s.resumed_chunks, s.rows, s.chunks) == (3, N_TEXTS, -(-(N_TEXTS + 2) // ROWS))
    assert pq.read_table(out).equals(pq.read_table(reference[0]))
    assert not partial_dir(out).exists()


def test_resume_refuses_a_changed_input(tmp_path, embedder, model_dir, monkeypatch):
    src = tmp_path / "c.txt"
    src.write_text("\n".join(_text(random.Random(2)) for _ in range(100)) + "\n")
    out = tmp_path / "o.parquet"
    job = CorpusJob(src, out, model=str(model_dir), rows_per_group=30)
    real = _Parts.commit

    def commit_once(self, table, nxt):
        real(self, table, nxt)
        raise KeyboardInterrupt                          # interrupted after the first chunk
    monkeypatch.setattr(_Parts, "commit", commit_once)
    with pytest.raises(KeyboardInterrupt):
        run_job(job, embedder_factory=lambda: embedder)
    monkeypatch.setattr(_Parts, "commit", real)
    src.write_text(src.read_text() + "w1 w2\n")
    with pytest.raises(CorpusError, match="different input"):
        run_job(job, embedder_factory=lambda: embedder)
    job.overwrite = True
    assert run_job(job, embedder_factory=lambda: embedder).rows == 101


def test_cli_errors(tmp_path):
    from torch_xdna.cli.main import main
    assert main(["embed", "--input", str(tmp_path / "x.csv"), "--output",
                 str(tmp_path / "o.parquet")]) == 2
    assert main(["embed", "--output", str(tmp_path / "o.parquet")]) == 2
    (tmp_path / "x.txt").write_text("a\n")
    assert main(["embed", "--input", str(tmp_path / "x.txt"), "--output",
                 str(tmp_path / "o.csv")]) == 2


# --- Ray ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20,
             log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_ray_20k_identical_parquet(reference, corpus, model_dir, tmp_path, ray_local):
    out = tmp_path / "ray.parquet"
    s = run_job(CorpusJob(corpus[0], out, model=str(model_dir), batch_size=256,
                          rows_per_group=ROWS, ray_address=""))
    assert (s.runner, s.workers, s.rows) == ("ray", 2, N_TEXTS)
    assert pq.read_table(out).equals(pq.read_table(reference[0]))
    assert pq.ParquetFile(out).metadata.num_row_groups == pq.ParquetFile(reference[0]).metadata.num_row_groups
