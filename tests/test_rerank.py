"""Reranking: a tiny random BertForSequenceClassification (built here, saved with save_pretrained)
scored on the simulator vs sentence-transformers' CrossEncoder on CPU (fp32); `/v1/rerank` in the
Cohere/Jina shape and TEI's `/rerank`; the registry's "rerank" kind; `xdna rerank`."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from fastapi.testclient import TestClient

from torch_xdna.engine.embed.embedder import default_model_dir
from torch_xdna.engine.embed.reranker import Reranker
from torch_xdna.models.hf import ModelDirError
from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.registry import ModelRegistry, model_kind

QUERY = "what is the capital of france?"
DOCS = ["Paris is the capital of France.", "The quick brown fox jumps.", "Berlin is in Germany",
        "paris " * 100, "France", "A capital letter starts a sentence.", "Lyon, France"]
MAX_LEN = 48                 # tokenizer_config model_max_length: the long doc gets truncated


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128, num_labels=1,
                     initializer_range=0.2)
    torch.manual_seed(0)
    model = BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(5)        # spread the scores (a random head is near-flat)
    d = tmp_path_factory.mktemp("ce") / "tiny-cross-encoder"
    model.save_pretrained(d)
    src = default_model_dir()                  # the bundled MiniLM's BERT uncased vocabulary
    for f in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(src / f, d / f)
    tok_cfg = json.loads((src / "tokenizer_config.json").read_text())
    tok_cfg["model_max_length"] = MAX_LEN
    (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return d


@pytest.fixture(scope="module")
def reference(ce_dir):
    """fp32 logits and sigmoid scores from sentence-transformers' CrossEncoder."""
    from sentence_transformers import CrossEncoder
    ce = CrossEncoder(str(ce_dir), device="cpu")
    pairs = [(QUERY, d) for d in DOCS]
    scores = ce.predict(pairs, convert_to_tensor=True).float()
    enc = ce.tokenizer([p[0] for p in pairs], [p[1] for p in pairs], truncation=True,
                       max_length=MAX_LEN)
    return torch.logit(scores.double()).float(), scores, enc


@pytest.fixture(scope="module")
def reranker(ce_dir):
    rr = Reranker.load(ce_dir)
    yield rr
    rr.close()


def test_pair_tokens_match_hf(reranker, reference):
    _, _, enc = reference
    pairs = reranker.tokenize_pairs(QUERY, DOCS)
    assert [p[0] for p in pairs] == enc["input_ids"]
    assert [p[1] for p in pairs] == enc["token_type_ids"]
    assert len(pairs[3][0]) == MAX_LEN and 1 in pairs[0][1]


def test_scores_match_cross_encoder(reranker, reference):
    ref_logits, ref_scores, _ = reference
    logits = reranker.logits_ids(reranker.tokenize_pairs(QUERY, DOCS))
    spread = float(ref_logits.max() - ref_logits.min())
    assert spread > 1.0, "the fixture's scores must be spread for an order check"
    # bf16 operands through 2 layers + head: within 3% of the logit range
    torch.testing.assert_close(logits, ref_logits, atol=0.03 * spread, rtol=0)
    torch.testing.assert_close(reranker.score(QUERY, DOCS), ref_scores, atol=0.02, rtol=0)
    # ranking identical wherever the reference separates two documents by more than the tolerance
    for i in range(len(DOCS)):
        for j in range(len(DOCS)):
            if ref_logits[i] - ref_logits[j] > 0.06 * spread:
                assert logits[i] > logits[j], (i, j)
    ranked = reranker.rank(QUERY, DOCS, top_n=3)
    assert [r.index for r in ranked] == sorted(range(len(DOCS)), key=lambda i: -float(logits[i]))[:3]
    # a document's score does not depend on its batch partners (nor on the batch size)
    alone = reranker.logits_ids(reranker.tokenize_pairs(QUERY, DOCS[:1]))
    assert float(alone[0]) == float(logits[0])


def test_registry_kind_and_errors(ce_dir, tmp_path):
    assert model_kind(ce_dir) == "rerank"
    assert model_kind(default_model_dir()) == "embedding"
    bad = tmp_path / "two-labels"
    shutil.copytree(ce_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["id2label"] = {"0": "a", "1": "b"}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirError, match="2 labels"):
        Reranker.load(bad)
    with pytest.raises(ModelDirError, match="ForSequenceClassification"):
        Reranker.load(default_model_dir())


@pytest.fixture(scope="module")
def client(reranker):
    reg = ModelRegistry()
    reg.add_object(reranker, "rerank", "tiny-reranker")
    with TestClient(create_app(ServerConfig(default_model=False), registry=reg)) as c:
        yield c


def test_v1_rerank_cohere_shape(client, reranker):
    logits = reranker.logits_ids(reranker.tokenize_pairs(QUERY, DOCS))
    order = sorted(range(len(DOCS)), key=lambda i: -float(logits[i]))
    r = client.post("/v1/rerank", json={"model": "tiny-reranker", "query": QUERY,
                                        "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]],
                                        "top_n": 4, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["index"] for x in body["results"]] == order[:4]
    assert body["results"][0]["document"] == {"text": DOCS[order[0]]}
    assert body["results"][0]["relevance_score"] == pytest.approx(
        float(torch.sigmoid(logits[order[0]])), abs=1e-6)
    assert body["model"] == "tiny-reranker" and body["usage"]["total_tokens"] > 0
    r = client.post("/v1/rerank", json={"query": QUERY, "documents": DOCS[:2]})
    assert len(r.json()["results"]) == 2 and "document" not in r.json()["results"][0]
    # TEI's shape
    r = client.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True,
                                     "return_text": True})
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()] == order
    assert r.json()[0]["score"] == pytest.approx(float(logits[order[0]]), abs=1e-6)
    assert r.json()[0]["text"] == DOCS[order[0]]


@pytest.mark.parametrize("body, status, needle", [
    ({"query": "", "documents": ["a"]}, 400, "query"),
    ({"query": "q", "documents": []}, 400, "documents"),
    ({"query": "q", "documents": ["a", ""]}, 400, "documents[1]"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    ({"query": "q", "documents": ["a"], "model": "nope"}, 404, "nope"),
    ({"query": "q", "documents": ["a"], "top_n": "many"}, 400, "top_n"),     # unknown fields are ignored (lenient, #33); wrong types are not
])
def test_v1_rerank_errors(client, body, status, needle):
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text


def test_cli_rerank(ce_dir, reranker, capsys):
    from torch_xdna.cli.main import main
    assert main(["rerank", QUERY, *DOCS[:3], "--model", str(ce_dir), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    logits = reranker.logits_ids(reranker.tokenize_pairs(QUERY, DOCS[:3]))
    assert [r["index"] for r in out["results"]] == sorted(range(3), key=lambda i: -float(logits[i]))
    assert out["results"][0]["document"]["text"] == DOCS[out["results"][0]["index"]]
    assert main(["rerank", QUERY, "a", "--model", str(default_model_dir())]) != 0
    assert "ForSequenceClassification" in capsys.readouterr().err
