"""The encoder engine: real all-MiniLM-L6-v2 on the simulator vs sentence-transformers on CPU,
bucketed batching and plan reuse, CLS pooling on a tiny random BERT, fused-block plans, the CLI."""
from __future__ import annotations

import io
import json
import shutil

import pytest
import torch

from torch_xdna.engine.embed.embedder import EmbedStats, Embedder, default_model_dir
from torch_xdna.hw import get_generation
from torch_xdna.kernels.blocks.encoder import (EncoderAttentionDesign, EncoderEmbeddingDesign,
                                               EncoderFFNDesign)
from torch_xdna.models.encoder import load_spec
from torch_xdna.models.hf import ModelDirError
from torch_xdna.runtime import PlanError

SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog!",
    "a",
    "What is the capital of France?",
    "Naïve café owners in Zürich serve crème brûlée — très délicieux.",
    "東京タワーは高さ333メートルです。",
    "Emoji test: 🚀🔥👍 rockets, fire and thumbs up.",
    "   leading and trailing spaces   ",
    "UPPER CASE SENTENCE WITH NUMBERS 12345 AND SYMBOLS #@$%^&*()",
    "def f(x): return x ** 2  # code is text too",
    "Привет, как дела? Всё хорошо.",
    "The NPU streams weights from DRAM; batching amortizes the dispatch cost.",
    "?!?!...;;;:::",
    "https://example.com/path?query=1&other=two",
    "Machine learning models transform sentences into dense vectors that capture meaning, "
    "so that similar sentences end up close to each other in the embedding space.",
    "A tab\tseparated\tline and a\nnewline.",
    "one two three four five six seven eight nine ten eleven twelve",
    # long: > 256 tokens, truncated at max_seq_length as sentence-transformers does
    " ".join(f"word{i} is part of a very long paragraph about nothing in particular."
             for i in range(60)),
]


@pytest.fixture(scope="module")
def embedder():
    emb = Embedder.load()
    yield emb
    emb.close()


@pytest.fixture(scope="module")
def st_vectors():
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(default_model_dir()), device="cpu")
    return model.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False).float()


def test_spec_of_bundled_model(embedder):
    s = embedder.spec
    assert (s.name, s.hidden, s.layers, s.heads, s.max_seq_length) == ("all-MiniLM-L6-v2", 384, 6, 12, 256)
    assert s.pooling == "mean" and s.normalize


def test_matches_sentence_transformers(embedder, st_vectors):
    ids = embedder.tokenize(SENTENCES, truncate=False)
    assert len(ids[-1]) > 256, "the long sentence must exceed max_seq_length"
    stats = EmbedStats()
    vecs = embedder.embed(SENTENCES, stats)
    assert vecs.shape == (len(SENTENCES), 384)
    cos = torch.nn.functional.cosine_similarity(vecs, st_vectors, dim=-1)
    worst = int(cos.argmin())
    assert cos.min() >= 0.999, f"cosine {cos.min():.5f} for {SENTENCES[worst]!r}"
    torch.testing.assert_close(vecs.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5, rtol=0)
    assert stats.dispatches == stats.batches and stats.modeled_us > 0
    assert stats.tokens == sum(min(len(x), 256) for x in ids)


def test_buckets_reuse_plans_and_batch_independence(embedder):
    dev = embedder.dev
    embedder.embed(SENTENCES[:4])
    plans_before = len(getattr(dev, "_plans", {}))
    stats = EmbedStats()
    together = embedder.embed(SENTENCES[:4], stats)
    assert len(getattr(dev, "_plans", {})) == plans_before, "same buckets must reuse cached plans"
    assert all(s in embedder.buckets for _, s in stats.shapes)
    assert all(b & (b - 1) == 0 for b, _ in stats.shapes), "batch sizes are powers of two"
    alone = torch.cat([embedder.embed([t]) for t in SENTENCES[:4]])
    # each sequence's GEMM tiles are computed on their own: bit-identical whatever the batch
    assert torch.equal(together, alone)


def test_batch_planning_respects_caps(embedder):
    lengths = [5] * 40 + [200] * 20
    batches = embedder.plan_batches(lengths)
    assert sorted(i for b in batches for i in b) == list(range(60))
    for b in batches:
        s = max(embedder.buckets[0], max(lengths[i] for i in b))
        assert len(b) <= embedder.max_batch
        assert len({lengths[i] for i in b}) == 1          # short ones never padded to 256
    assert all(len(b) * 256 <= embedder.max_batch_tokens for b in batches if lengths[b[0]] == 200)


def _bench_corpus(n: int, seed: int) -> list[str]:
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_embed.py"
    spec = importlib.util.spec_from_file_location("bench_embed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.realistic_corpus(n, seed=seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_padding_on_realistic_mix_is_within_ten_percent(embedder, seed):
    """512 sentences of 5-120 words, batch 32: processed tokens (padding incl.) <= 1.1x real."""
    lengths = [len(x) for x in embedder.tokenize(_bench_corpus(512, seed))]
    batches = embedder.plan_batches(lengths)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(len(b) <= embedder.max_batch for b in batches)
    assert embedder.padded_tokens(lengths) <= 1.1 * sum(lengths)
    assert len(batches) <= 2 * len(lengths) // embedder.max_batch + 4, "not fragmented"


def test_small_launches_run_on_one_host_thread():
    from torch_xdna.runtime.sim.threads import SMALL_LAUNCH_MACS, launch_threads
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with launch_threads(SMALL_LAUNCH_MACS - 1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with launch_threads(SMALL_LAUNCH_MACS):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _tiny_bert_dir(tmp_path, pooling_cls: bool):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128, hidden_act="gelu")
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    d = tmp_path / "tiny-bert"
    model.save_pretrained(d)
    shutil.copy(default_model_dir() / "tokenizer.json", d / "tokenizer.json")
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": pooling_cls,
         "pooling_mode_mean_tokens": not pooling_cls}))
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32,
                                                             "do_lower_case": False}))
    return d, model


def test_cls_pooling_tiny_bert_matches_transformers(tmp_path):
    d, model = _tiny_bert_dir(tmp_path, pooling_cls=True)
    emb = Embedder.load(d)
    try:
        assert emb.spec.pooling == "cls" and not emb.spec.normalize
        assert emb.spec.max_seq_length == 32
        texts = ["hello there", "a somewhat longer sentence with more tokens in it", "x"]
        vecs = emb.embed(texts)
        ids = emb.tokenize(texts)
        for v, x in zip(vecs, ids):
            with torch.no_grad():
                ref = model(torch.tensor([x])).last_hidden_state[0, 0]
            cos = torch.nn.functional.cosine_similarity(v, ref, dim=0)
            assert cos >= 0.999, cos
            torch.testing.assert_close(v.norm(), ref.norm(), rtol=2e-2, atol=0)
    finally:
        emb.close()


def test_decoder_dir_is_not_an_encoder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ModelDirError, match="model_type 'qwen3' is not a supported encoder"):
        load_spec(tmp_path)


def test_fused_plans_sum_components_and_check_capacity():
    gen = get_generation("npu4")
    attn = EncoderAttentionDesign(4, 64, 384, 12, 1e-12)
    plan = attn.plan(gen)
    parts = [c.plan(gen) for c in attn.components()]
    assert plan.dram_read_bytes == sum(p.dram_read_bytes for p in parts)
    assert plan.macs == sum(p.macs for p in parts)
    qkv_macs = 4 * 64 * 384 * 3 * 384
    assert plan.macs >= qkv_macs
    ffn = EncoderFFNDesign(256, 384, 1536, 1e-12).plan(gen)
    assert ffn.compute_cycles > 0 and ffn.l1_bytes <= gen.l1_usable
    with pytest.raises(PlanError, match="position table"):
        EncoderEmbeddingDesign(30522, 512, 384, 1, 1024, 1e-12).plan(gen)
    with pytest.raises(PlanError, match="L1"):
        # a softmax row of 64k scores cannot sit in one core's L1
        EncoderAttentionDesign(1, 65536, 64, 1, 1e-12).plan(gen)


def test_cli_embed_json_and_stdin(capsys, monkeypatch, embedder):
    from torch_xdna.cli.main import main
    assert main(["embed", "hello world", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "all-MiniLM-L6-v2" and out["dimensions"] == 384
    v = torch.tensor(out["data"][0]["embedding"])
    torch.testing.assert_close(v, embedder.embed(["hello world"])[0], atol=2e-5, rtol=0)
    monkeypatch.setattr("sys.stdin", io.StringIO("first line\n\nsecond line\n"))
    assert main(["embed", "-"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == 2 and "(384 dims)" in lines[0] and lines[1].endswith("second line")
    assert "simulated NPU" in captured.err and "modeled" in captured.err
