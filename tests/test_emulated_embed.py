"""`xdna embed` end to end on the emulated NPU (issue #28, emulated results only).

A small random-weight BERT sentence-transformers directory (hidden 64, 2 heads of 32 as in
all-MiniLM-L6-v2, 2 layers, mean pooling + Normalize, sequences up to 16 tokens) is built by
`xdna kernels build --model` with the fake toolchain (tests/fake_toolchain.py: it wraps our MLIR
and stream as aiecc would), then embedded through the xrt backend on the emulated NPU
(TORCH_XDNA_XRT=emulated): every launch (embeddings, each layer's attention and FFN, pooling)
runs its artifact's stage instruction streams with the host-compiled C++ core kernels. The
simulator's functional level in the stages' order with the core kernels' GEMM order
(TORCH_XDNA_LAYER_ORDER=plan, TORCH_XDNA_GEMM_ORDER=kernel) is the reference the vectors must
equal bit for bit; the default (fast) reference within cosine 0.9999."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from emulated_env import build_artifacts, run_job
from torch_xdna.engine.embed.embedder import default_model_dir

TEXTS = ["hello there", "a somewhat longer sentence with more tokens", "x"]
MAX_BATCH = "4"                        # 3 texts run in the 4-sequence bucket


def _tiny_bert(d) -> None:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=64, hidden_act="gelu")
    torch.manual_seed(0)
    BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(d)
    shutil.copy(default_model_dir() / "tokenizer.json", d / "tokenizer.json")
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}))
    (d / "2_Normalize").mkdir()
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16,
                                                             "do_lower_case": False}))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(model dir, artifact store, build summary) of the tiny BERT, built once."""
    root = tmp_path_factory.mktemp("emuembed")
    model = root / "tiny-bert"
    model.mkdir()
    _tiny_bert(model)
    store, summary = build_artifacts(root, model, "--max-batch", MAX_BATCH)
    return model, store, summary


def _embed(model, capsys, monkeypatch, store=None, kernel_order: bool = True) -> dict:
    return run_job(["embed", "--model", str(model), "--json", *TEXTS], capsys, monkeypatch,
                   store, kernel_order)


def _vectors(res: dict) -> torch.Tensor:
    return torch.tensor([d["embedding"] for d in res["data"]])


def test_kernels_build_model_builds_every_launch_of_the_embedder(built):
    """Batch buckets 1, 2, 4 x sequence buckets 8, 16: four designs each, none skipped."""
    _, store, summary = built
    assert not summary["skipped"] and not summary.get("failed")
    keys = sorted(p.name for p in store.iterdir() if (p / "manifest.json").exists())
    assert len(keys) == 24
    assert {k.split("-")[0] for k in keys} == {"encoder_embedding", "encoder_attention",
                                               "encoder_ffn", "encoder_pool"}


def test_embed_on_the_emulated_npu_equals_the_simulator(built, capsys, monkeypatch):
    model, store, _ = built
    sim = _embed(model, capsys, monkeypatch)
    emu = _embed(model, capsys, monkeypatch, store)
    assert emu["backend"] == "xrt" and sim["backend"] == "sim"
    v_emu, v_sim = _vectors(emu), _vectors(sim)
    assert v_emu.shape == (3, 64)
    assert torch.equal(v_emu, v_sim)
    fast = _vectors(_embed(model, capsys, monkeypatch, kernel_order=False))
    cos = torch.nn.functional.cosine_similarity(v_emu, fast, dim=-1)
    assert float(cos.min()) >= 0.9999, cos


def _serve_embeddings(model, monkeypatch, store=None) -> tuple[torch.Tensor, str]:
    """(vectors, the server's backend) of one /v1/embeddings request through `xdna serve`'s
    app and the official OpenAI client."""
    import openai
    from emulated_env import select_backend
    from torch_xdna.runtime.backends import set_device_for_testing
    from torch_xdna.runtime.xrt.session import release_devices
    from torch_xdna.server.app import create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.config import ServerConfig
    from torch_xdna.server.registry import ModelRegistry
    prev = select_backend(monkeypatch, store)
    try:
        reg = ModelRegistry()
        reg.add_dir(model, name="tiny-bert")
        app = create_app(ServerConfig(default_model=False), registry=reg)
        with BackgroundServer(app) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
            r = client.embeddings.create(model="tiny-bert", input=TEXTS)
            return (torch.tensor([d.embedding for d in r.data]),
                    app.state.server.dev.backend)
    finally:
        set_device_for_testing(prev)
        release_devices()


def test_serve_embeddings_on_the_emulated_npu_equals_the_simulator(built, monkeypatch):
    """`xdna serve`'s /v1/embeddings, asked with the official OpenAI client: the emulated NPU's
    vectors are the simulator's (emulated results)."""
    model, store, _ = built
    sim, sim_backend = _serve_embeddings(model, monkeypatch)
    emu, emu_backend = _serve_embeddings(model, monkeypatch, store)
    assert (sim_backend, emu_backend) == ("sim", "xrt")
    assert emu.shape == (3, 64) and torch.equal(emu, sim)
