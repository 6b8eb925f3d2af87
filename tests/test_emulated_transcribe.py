"""`xdna transcribe` end to end on the emulated NPU (issue #28, emulated results only).

A random-weight Whisper directory with the micro shape (tests/whisper_fixtures: d_model 64, 2
layers, 2 heads; the real 80 mels x 3000 frames window, 1500 encoder positions) is built by
`xdna kernels build --model` with the fake toolchain (tests/fake_toolchain.py wraps our MLIR and
stream as aiecc would), then transcribed through the xrt backend on the emulated NPU
(TORCH_XDNA_XRT=emulated): the stem, both encoder layers, both cross K/V launches, then the
decoder's embed, layers and head of the prompt's rows bucket and of every decode step each run
their artifact's instruction streams with the host-compiled C++ core kernels, the cross K/V and
the self-attention KV cache resident in device memory. The reference is the simulator's
functional level in the stages' order (TORCH_XDNA_LAYER_ORDER=plan, TORCH_XDNA_GEMM_ORDER=kernel):
the tokens must be identical. The Whisper-base directory's designs are checked against mlir-aie's
rules in tests/test_array_rules.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from emulated_env import build_artifacts, run_job
from whisper_fixtures import make_whisper_dir

CLIP = Path(__file__).resolve().parents[1] / "torch_xdna" / "engine" / "asr" / "speech" / "clip00.flac"
ARGS = ["--prefill-chunk", "4"]          # decoder buckets 4, 2, 1: the 4-token prompt, then decode


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("emuasr")
    model = make_whisper_dir(root / "micro", "micro", seed=3)
    store, summary = build_artifacts(root, model, *ARGS)
    return model, store, summary


def _transcribe(model, capsys, monkeypatch, store=None) -> dict:
    return run_job(["transcribe", str(CLIP), "--model", str(model), "--language", "en",
                    "--json", "--max-new-tokens", "6"], capsys, monkeypatch, store)


def test_kernels_build_model_builds_every_whisper_launch(built):
    """Stem, encoder layer, cross K/V (first, later), and embed / layer / head per decoder
    bucket 4, 2, 1: 13 artifacts, none skipped, none failed."""
    _, store, summary = built
    assert not summary["skipped"] and not summary.get("failed")
    keys = sorted(p.name for p in store.iterdir() if (p / "manifest.json").exists())
    kinds = [k.split("-")[0] for k in keys]
    assert len(keys) == 13
    assert {k: kinds.count(k) for k in set(kinds)} == {
        "whisper_stem": 1, "whisper_encoder_layer": 1, "whisper_cross_kv": 2, "whisper_embed": 3,
        "whisper_decoder_layer": 3, "whisper_head": 3}


def test_transcribe_on_the_emulated_npu_equals_the_simulator(built, capsys, monkeypatch):
    model, store, _ = built
    sim = _transcribe(model, capsys, monkeypatch)
    emu = _transcribe(model, capsys, monkeypatch, store)
    toks = [t for s in sim["segments"] for t in s["tokens"]]
    assert toks, sim
    assert [t for s in emu["segments"] for t in s["tokens"]] == toks
    assert emu["text"] == sim["text"]


def test_a_missing_whisper_artifact_is_named(built, capsys, monkeypatch, tmp_path):
    """Without the head's artifacts the job stops with the design named and what to run;
    nothing falls back to the host."""
    import shutil

    from emulated_env import select_backend
    from torch_xdna.cli.main import main
    from torch_xdna.runtime.backends import set_device_for_testing
    from torch_xdna.runtime.xrt.session import release_devices
    model, store, _ = built
    partial = tmp_path / "store"
    shutil.copytree(store, partial)
    for p in partial.iterdir():
        if p.name.startswith("whisper_head-"):
            shutil.rmtree(p)
    prev = select_backend(monkeypatch, partial)
    try:
        capsys.readouterr()
        rc = main(["transcribe", str(CLIP), "--model", str(model), "--language", "en",
                   "--max-new-tokens", "2"])
    finally:
        set_device_for_testing(prev)
        release_devices()
    err = capsys.readouterr().err
    assert rc != 0
    assert "no hardware artifact for whisper.head[bf16]" in err and "xdna kernels build" in err
