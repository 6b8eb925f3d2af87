"""`xdna generate` end to end on the emulated NPU (issue #28, emulated results only).

A small random-weight Qwen3 directory (tests/llm_fixtures) is built by `xdna kernels build
--model` with the fake toolchain (it wraps our MLIR and stream as aiecc would; tests/
fake_toolchain.py), then generated through the xrt backend on the emulated NPU
(TORCH_XDNA_XRT=emulated): the embedding, both decoder layers and the head of every prefill rows
bucket and of decode each run their artifact's instruction streams with the host-compiled C++
core kernels, the KV cache resident in device memory. The simulator's functional level in the
stages' order with the core kernels' GEMM order (TORCH_XDNA_LAYER_ORDER=plan,
TORCH_XDNA_GEMM_ORDER=kernel) is the reference the tokens must equal."""
from __future__ import annotations

import pytest

from emulated_env import build_artifacts, run_job, select_backend
from llm_fixtures import build_model
from torch_xdna.cli.main import main
from torch_xdna.runtime.backends import set_device_for_testing
from torch_xdna.runtime.xrt.session import release_devices

PROMPT = "hello number 5, the quick brown fox"          # 10 tokens: a partial prefill bucket
ARGS = ["--precision", "bf16", "--max-context", "256", "--prefill-chunk", "16"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(model dir, artifact store, build summary) of the tiny Qwen3, built once."""
    root = tmp_path_factory.mktemp("emugen")
    model = root / "tiny-qwen3"
    build_model("qwen3", model, seed=5)
    store, summary = build_artifacts(root, model, *ARGS)
    return model, store, summary


def _generate(model, capsys, monkeypatch, store=None, kernel_order: bool = True) -> dict:
    return run_job(["generate", str(model), PROMPT, "--max-tokens", "8", "--temperature", "0",
                    "--json", *ARGS], capsys, monkeypatch, store, kernel_order)


def test_kernels_build_model_builds_every_launch_of_the_engine(built):
    """Embedding, layer and head for the prefill buckets 16, 8, 4, 2 (and 1 = decode): 15
    artifacts, none skipped, none failed."""
    _, store, summary = built
    assert not summary["skipped"] and not summary.get("failed")
    keys = sorted(p.name for p in store.iterdir() if (p / "manifest.json").exists())
    assert len(keys) == 15
    assert {k.split("-")[0] for k in keys} == {"llm_embed", "llm_layer", "llm_head"}


def test_generate_on_the_emulated_npu_equals_the_simulator(built, capsys, monkeypatch):
    """Prefill (10 tokens in the 16-row bucket) and 7 decode steps with the KV cache resident:
    the emulated NPU's tokens are the simulator's, and its figures are labeled emulated."""
    model, store, _ = built
    sim = _generate(model, capsys, monkeypatch)
    emu = _generate(model, capsys, monkeypatch, store)
    assert emu["backend"] == "xrt" and sim["backend"] == "sim"
    assert len(emu["token_ids"]) == 8
    assert emu["token_ids"] == sim["token_ids"]
    assert "emulated" in emu and "measured_npu" not in emu
    # the default functional level (BLAS order) agrees on these 8 tokens as well
    assert _generate(model, capsys, monkeypatch, kernel_order=False)["token_ids"] == emu["token_ids"]


def test_a_missing_artifact_is_named_with_the_build_command(built, capsys, monkeypatch, tmp_path):
    """A context the artifacts were not built for: the error names the design and what to do."""
    model, store, _ = built
    prev = select_backend(monkeypatch, store)
    try:
        rc = main(["generate", str(model), PROMPT, "--max-tokens", "2", "--json", "--precision",
                   "bf16", "--max-context", "128", "--prefill-chunk", "16"])
    finally:
        set_device_for_testing(prev)
        release_devices()
    err = capsys.readouterr().err
    assert rc != 0 and "no hardware artifact for llm." in err and "xdna kernels build" in err


def _serve_chat(model, monkeypatch, store=None) -> tuple[str, str]:
    """(reply text, the server's backend) of one greedy chat through `xdna serve`'s app and the
    official OpenAI client."""
    import openai
    from torch_xdna.server.app import create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.config import ServerConfig
    from torch_xdna.server.registry import ModelRegistry
    prev = select_backend(monkeypatch, store)
    try:
        reg = ModelRegistry(max_context=256, prefill_chunk=16)
        reg.add_dir(model, name="tiny")
        app = create_app(ServerConfig(default_model=False, max_context=256, prefill_chunk=16),
                         registry=reg)
        with BackgroundServer(app) as srv:
            client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none")
            r = client.chat.completions.create(model="tiny", max_tokens=6, temperature=0,
                                               messages=[{"role": "user", "content": PROMPT}])
            return r.choices[0].message.content, app.state.server.dev.backend
    finally:
        set_device_for_testing(prev)
        release_devices()


def test_serve_chat_on_the_emulated_npu_equals_the_simulator(built, monkeypatch):
    """`xdna serve`'s chat endpoint, asked with the official OpenAI client: on the emulated NPU
    (each request decodes alone: the batched step has no artifact) the reply is the simulator's."""
    model, store, _ = built
    sim_text, sim_backend = _serve_chat(model, monkeypatch)
    emu_text, emu_backend = _serve_chat(model, monkeypatch, store)
    assert (sim_backend, emu_backend) == ("sim", "xrt")
    assert emu_text == sim_text and len(emu_text) > 0


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_other_families_generate_on_the_emulated_npu(family, tmp_path, capsys, monkeypatch):
    """Llama-style layers (no q/k norm: the rope-only q/k stage) and Gemma 3 layers (1 + w
    norms, post-norms after attention and MLP, the GeGLU gate, sliding-window layers, scaled
    embeddings) build and generate on the emulated NPU with the simulator's tokens. The tiny
    configs' widths are tile-friendly (intermediate 128); Gemma's logit softcap is off (the head
    has no tanh stage; real Gemma 3 checkpoints have none)."""
    model = tmp_path / f"tiny-{family}"
    extra = {"final_logit_softcapping": None} if family == "gemma3" else {}   # no tanh stage yet
    build_model(family, model, seed=7, intermediate_size=128, **extra)
    store, summary = build_artifacts(tmp_path, model, *ARGS)
    assert not summary["skipped"] and not summary.get("failed")
    sim = _generate(model, capsys, monkeypatch)
    emu = _generate(model, capsys, monkeypatch, store)
    assert emu["backend"] == "xrt" and len(emu["token_ids"]) == 8
    assert emu["token_ids"] == sim["token_ids"]
