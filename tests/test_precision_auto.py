"""`--precision auto` (engine/precision_auto.py): the greedy search promotes the most sensitive
op group, a tiny random decoder gets a choice that is written beside it and reused without
measuring, and a budget nothing meets falls back to bf16 with a one-line warning."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llm_fixtures import build_model  # noqa: E402

from torch_xdna.engine import accuracy as acc  # noqa: E402
from torch_xdna.engine import precision_auto as pa  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_budget_parse_and_share():
    b = pa.Budget.parse("perplexity=3%, agreement=90, wer=1")
    assert (b.perplexity, b.agreement, b.wer, b.cosine) == (0.03, 0.9, 0.01, 0.999)
    assert pa.Budget.parse(None) == pa.Budget()
    assert b.used({"perplexity_rise": 0.015, "agreement_with_fp32": 0.95}) == pytest.approx(0.5)
    assert b.used({"wer_rise": 0.02}) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="perplexity=P%"):
        pa.Budget.parse("ppl=2")


def test_greedy_search_promotes_the_most_sensitive_group():
    # head is the sensitive group: int4 anywhere else costs little accuracy
    loss = {"int4": {"attention": 0.3, "mlp": 0.4, "head": 2.0}, "int8": dict.fromkeys(
        ("attention", "mlp", "head"), 0.1), "bf16": dict.fromkeys(("attention", "mlp", "head"), 0.0)}
    calls = []

    def measure(a):
        calls.append(dict(a))
        rise = 0.01 * sum(loss[p][g] for g, p in a.items())
        return {"perplexity": 10 * (1 + rise), "perplexity_rise": rise, "agreement_with_fp32": 1.0}
    cost = lambda a: sum({"int4": 1, "int8": 2, "bf16": 4}[p] for p in a.values())  # noqa: E731
    chosen, within, measured = pa.greedy_search(("attention", "mlp", "head"),
                                                ("int4", "int8", "bf16"), measure, cost,
                                                pa.Budget(), lambda s: None)
    assert within and chosen == {"attention": "int4", "mlp": "int4", "head": "int8"}
    assert len(calls) == len({tuple(sorted(c.items())) for c in calls}) <= 3 + 2 * 3


@pytest.fixture
def tiny(tmp_path):
    d = tmp_path / "auto-qwen3"
    build_model("qwen3", d)
    return d


def test_auto_picks_writes_and_reuses(tiny, monkeypatch, capsys):
    from torch_xdna.engine.llm.generate import load_decoder
    load = lambda p: load_decoder(tiny, p, max_context=24, quiet=True, cache_dir=False)  # noqa: E731
    budget = "perplexity=20%,agreement=50%"
    eng = load_decoder(tiny, "auto", budget=budget, max_context=32, quiet=True, cache_dir=False)
    eng.close()
    doc = json.loads((tiny / pa.FILE_NAME).read_text())
    (entry,) = doc["entries"].values()
    assert entry["within_budget"] and set(entry["precision"]) == set(pa.DECODER_GROUPS)
    assert entry["measured"] and entry["modeled"]["chosen_ms_per_token"] > 0
    assert eng.decoder.policy == eng.decoder.policy.parse(
        pa.Choice(**{k: entry[k] for k in pa.Choice.__dataclass_fields__ if k in entry}).policy())
    # the second run measures nothing: the stored choice for (digest, budget, calibration)
    monkeypatch.setattr(acc, "decoder_run", lambda *a, **k: pytest.fail("measured again"))
    again = pa.choose_decoder(tiny, load, budget=budget)
    assert again.reused and again.precision == entry["precision"]
    assert Path(again.path) == tiny / pa.FILE_NAME
    # another budget is another entry, re-scoring the stored measurements: a looser one needs
    # no new measurement, one nothing stored meets measures; other weights measure again
    looser = pa.choose_decoder(tiny, load, budget="perplexity=30%,agreement=40%")
    assert not looser.reused and looser.precision == entry["precision"]
    assert len(json.loads((tiny / pa.FILE_NAME).read_text())["entries"]) == 2
    with pytest.raises(pytest.fail.Exception):
        pa.choose_decoder(tiny, load, budget="perplexity=-50%")
    (tiny / "extra.bin").write_bytes(b"changed")
    with pytest.raises(pytest.fail.Exception):
        pa.choose_decoder(tiny, load, budget=budget)


def test_budget_nothing_meets_falls_back_to_bf16_with_a_warning(tiny, tmp_path, monkeypatch,
                                                                 capsys):
    from torch_xdna.engine.llm.generate import load_decoder
    real_publish = pa.publish

    def read_only(path, *a, **k):            # the model directory refuses writes (even as root)
        if path.parent == tiny:
            raise PermissionError(13, "Permission denied")
        return real_publish(path, *a, **k)
    monkeypatch.setattr(pa, "publish", read_only)
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path / "cache"))
    c = pa.choose_decoder(tiny, lambda p: load_decoder(tiny, p, max_context=24, quiet=True,
                                                       cache_dir=False),
                          budget="perplexity=-50%", tokens=12, log=lambda s: None)
    assert not c.within_budget and c.policy() == "bf16"
    assert Path(c.path).parent == tmp_path / "cache" / "precision-auto"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no precision" in err[0] and "bf16" in err[0]


def test_cli_generate_auto_then_reuse(tiny, capsys):
    from torch_xdna.cli.main import main
    args = ["generate", str(tiny), "the quick", "--max-tokens", "2", "--precision", "auto",
            "--precision-budget", "perplexity=20%,agreement=50%", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args[:-1]) == 0                 # not quiet: the choice is named on stderr
    err = capsys.readouterr().err
    assert "reusing" in err and "choosing" not in err and first["precision"] in err
    with pytest.raises(SystemExit) as e:       # a bad budget fails at parse time
        main(["generate", str(tiny), "x", "--precision", "auto", "--precision-budget", "ppl=2"])
    assert e.value.code == 2 and "perplexity=P%" in capsys.readouterr().err


def test_whisper_auto_on_a_micro_model(tmp_path, capsys):
    import shutil
    from whisper_fixtures import make_whisper_dir
    from torch_xdna.engine.asr.transcribe import Transcriber
    d = tmp_path / "whisper-micro"
    make_whisper_dir(d)
    speech = tmp_path / "speech"
    speech.mkdir()
    clip = acc.load_speech_set(acc.SPEECH_SET)[0]
    shutil.copy(clip[0], speech / clip[0].name)
    (speech / "transcripts.json").write_text(json.dumps([{"file": clip[0].name, "text": clip[1]}]))
    load = lambda p: Transcriber.load(d, p)  # noqa: E731
    from torch_xdna.engine.asr.transcribe import TranscribeOptions
    opts = TranscribeOptions(language="en", max_new_tokens=8)
    c = pa.choose_whisper(d, load, opts, budget="wer=1000%", speech=speech, log=lambda s: None)
    assert c.within_budget and c.policy() == "int8"       # the cheapest, within this budget
    assert Path(c.path) == d / pa.FILE_NAME
    assert c.modeled["chosen_ms_per_window"] < c.modeled["bf16_ms_per_window"]
    again = pa.choose_whisper(d, lambda p: pytest.fail("loaded"), opts, budget="wer=1000%",
                              speech=speech, log=lambda s: None)
    assert again.reused and again.policy() == "int8"
