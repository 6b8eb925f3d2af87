"""`xdna accuracy` (engine/accuracy.py): word error rate, perplexity and fp32 agreement computed
right, on a tiny random Qwen3 (fast); the figures for real checkpoints are in docs/accuracy.md."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from llm_fixtures import build_model  # noqa: E402

from torch_xdna.engine import accuracy as acc  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_wer_counts_word_edits():
    assert acc.wer("The quick brown fox.", "the quick brown fox") == (0, 4)
    assert acc.wer("the quick brown fox", "the quick fox jumps") == (2, 4)   # 1 del + 1 ins
    assert acc.wer("a b c", "") == (3, 3)


def test_reference_text_is_real_prose():
    text, name = acc.reference_text()
    assert "exception" in text.lower() and len(text.split()) > 200 and "pydoc_data" in name


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("acc-qwen3")
    build_model("qwen3", d)
    return d


def test_decoder_rows_against_a_direct_computation(tiny):
    from torch_xdna.engine.llm.generate import load_decoder
    rows = acc.decoder_rows(tiny, ("fp32", "int4"), tokens=24, load=lambda p: load_decoder(
        tiny, p, max_context=32, quiet=True, cache_dir=False))
    fp32, int4 = rows
    assert fp32["agreement_with_fp32"] == 1.0 and 0.0 <= int4["agreement_with_fp32"] <= 1.0
    assert fp32["modeled_ms_per_token"] > 0 and int4["modeled_ms_per_token"] > 0
    # perplexity = exp(mean NLL) of the same teacher-forced logits, recomputed here
    eng = load_decoder(tiny, "fp32", max_context=32, quiet=True, cache_dir=False)
    ids = eng.tokenizer.encode(acc.reference_text()[0])[:24]
    logits = torch.stack([eng.decoder.forward([t]) for t in ids[:-1]])
    eng.close()
    want = math.exp(torch.nn.functional.cross_entropy(logits.double(), torch.tensor(ids[1:])))
    assert fp32["perplexity"] == pytest.approx(want, rel=1e-9)


def test_cli_accuracy_json_and_errors(tiny, capsys, tmp_path):
    from torch_xdna.cli.main import main
    assert main(["accuracy", str(tiny), "--precision", "bf16", "--tokens", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rows"][0]["precision"] == "bf16" and doc["time"] == "modeled"
    with pytest.raises(ValueError, match="transcripts.json"):
        acc.load_speech_set(tmp_path)
    assert main(["accuracy", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
