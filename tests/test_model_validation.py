"""Model directories are validated in one pass before anything is allocated (issue 15, item 4):
errors name the file, the field, the value and what was expected; `public_message` has no path."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from llm_fixtures import build_model
from torch_xdna.engine.llm.generate import load_decoder
from torch_xdna.models.hf import ModelDirError

PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    build_model("qwen3", path, seed=1)
    return path


@pytest.fixture
def model(good_dir, tmp_path, monkeypatch):
    """A private copy of the good model; loading it must never reach the weights."""
    d = tmp_path / "m"
    shutil.copytree(good_dir, d)
    return d


def _patch(path, **fields):
    cfg = json.loads(path.read_text()) if path.exists() else {}
    for k, v in fields.items():
        if v is _DROP:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    path.write_text(json.dumps(cfg))


_DROP = object()


def _refused(d, monkeypatch, *words, **kw) -> ModelDirError:
    """load_decoder(d) raises a ModelDirError naming `words`, without reading a weight tensor."""
    import torch_xdna.models.loader as loader

    def no_read(*a, **k):
        raise AssertionError("weights were read before validation finished")
    monkeypatch.setattr(loader, "_hf_tensors", no_read)
    with pytest.raises(ModelDirError) as ei:
        load_decoder(d, cache_dir=False, quiet=True, **kw)
    e = ei.value
    for w in words:
        assert w in str(e), (w, str(e))
        assert w in e.public_message, (w, e.public_message)
    assert str(d) not in e.public_message and str(d.parent) not in e.public_message
    return e


@pytest.mark.parametrize("field,value,expected", [
    ("hidden_size", "64", "an integer"),
    ("num_attention_heads", [4], "an integer"),
    ("num_key_value_heads", 3, "a divisor of num_attention_heads"),
    ("intermediate_size", 0, "an integer in [1"),
    ("rms_norm_eps", "tiny", "a finite number > 0"),
    ("tie_word_embeddings", "false", "true or false"),
    ("eos_token_id", "</s>", "a token id"),
    ("eos_token_id", 10**6, "< vocab_size"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": "big"}, "a finite number"),
    ("layer_types", ["full_attention"], "one entry per layer"),
])
def test_config_with_wrong_types_names_file_field_value(model, monkeypatch, field, value, expected):
    _patch(model / "config.json", **{field: value})
    e = _refused(model, monkeypatch, "config.json", field, expected)
    assert str(model / "config.json") in str(e)               # the CLI message has the full path


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "vocab_size"])
def test_config_with_missing_fields(model, monkeypatch, field):
    _patch(model / "config.json", **{field: _DROP})
    _refused(model, monkeypatch, "config.json", field, "missing")


@pytest.mark.parametrize("content,words", [
    ([1, 2], ("generation_config.json", "JSON object")),
    ({"eos_token_id": "x"}, ("generation_config.json", "eos_token_id", "a token id")),
    ({"top_p": 7}, ("generation_config.json", "top_p", "(0, 1]")),
    ({"temperature": -1}, ("generation_config.json", "temperature", ">= 0")),
])
def test_bad_generation_config(model, monkeypatch, content, words):
    (model / "generation_config.json").write_text(json.dumps(content))
    _refused(model, monkeypatch, *words)


def test_generation_config_not_json(model, monkeypatch):
    (model / "generation_config.json").write_text("{nope")
    _refused(model, monkeypatch, "generation_config.json", "not valid JSON")


def test_deeply_nested_config_is_an_error_not_a_recursion_error(model, monkeypatch):
    (model / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(model, monkeypatch, "config.json", "JSON")


@pytest.mark.parametrize("where", ["tokenizer_config", "jinja_file"])
def test_bad_chat_template_fails_at_load(model, monkeypatch, where):
    bad = "{% for m in messages %}{{ m.content }"        # unclosed tag and loop
    if where == "tokenizer_config":
        _patch(model / "tokenizer_config.json", chat_template=bad)
        _refused(model, monkeypatch, "tokenizer_config.json", "chat_template", "valid Jinja")
    else:
        _patch(model / "tokenizer_config.json", chat_template=_DROP)
        (model / "chat_template.jinja").write_text(bad)
        _refused(model, monkeypatch, "chat_template.jinja", "valid Jinja")


def test_chat_template_of_the_wrong_type(model, monkeypatch):
    _patch(model / "tokenizer_config.json", chat_template=42)
    _refused(model, monkeypatch, "tokenizer_config.json", "chat_template", "a Jinja template string")


def test_broken_tokenizer_json(model, monkeypatch):
    (model / "tokenizer.json").write_text("{}")
    _refused(model, monkeypatch, "tokenizer.json")


def test_hidden_size_not_matching_the_weights_fails_at_load(model, monkeypatch):
    _patch(model / "config.json", hidden_size=128)
    e = _refused(model, monkeypatch, "model.embed_tokens.weight", "[400, 64]", "[400, 128]",
                 "hidden_size")
    assert ".safetensors" in e.public_message


def test_missing_weight_is_named(model, monkeypatch):
    _patch(model / "config.json", num_hidden_layers=3, layer_types=_DROP)   # the files hold 2
    _refused(model, monkeypatch, "model.layers.2.", "missing")


@pytest.mark.parametrize("layers", [1e9, 10**9])
def test_absurd_layer_count_is_refused_up_front(model, monkeypatch, layers):
    _patch(model / "config.json", num_hidden_layers=layers, layer_types=_DROP)
    t0 = time.perf_counter()
    _refused(model, monkeypatch, "config.json", "num_hidden_layers", "an integer in [1, 1024]")
    assert time.perf_counter() - t0 < 5


def test_model_larger_than_the_memory_budget_is_refused_before_allocating(model, monkeypatch):
    from torch_xdna.engine.llm.decoder import ModelTooLarge
    from torch_xdna.runtime import get_device
    from torch_xdna.runtime.sim import SimDevice
    dev = SimDevice(get_device().gen, 100_000)              # the tiny model needs ~259 kB in bf16
    e = _refused(model, monkeypatch, "GiB", "TORCH_XDNA_MEMORY_BUDGET", device=dev)
    assert isinstance(e, ModelTooLarge)
    assert dev.counters.allocated_bytes == 0 and dev.counters.peak_allocated_bytes == 0


@pytest.mark.parametrize("family", ["qwen3", "llama", "gemma3"])
def test_resident_estimate_is_exact(tmp_path, family):
    """The up-front budget check uses the bytes the decoder really allocates."""
    from torch_xdna.engine.llm.decoder import resident_bytes_estimate
    build_model(family, tmp_path, seed=1)
    for precision in ("bf16", "int4"):
        e = load_decoder(tmp_path, precision, max_context=48, cache_dir=False, quiet=True)
        d = e.decoder
        try:
            assert resident_bytes_estimate(d.spec, d.policy, d.capacity, d.chunk) == d.resident_bytes
        finally:
            e.close()


def test_cli_prints_one_line_naming_the_field(model, capsys):
    from torch_xdna.cli.main import main
    _patch(model / "config.json", hidden_size="wide")
    assert main(["generate", str(model), PROMPT, "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unexpected" not in err
    assert "config.json" in err and "hidden_size" in err and "'wide'" in err


def test_encoder_config_with_wrong_types(tmp_path):
    from torch_xdna.models.encoder import load_spec
    cfg = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4,
           "num_hidden_layers": {"n": 2}, "intermediate_size": 64, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelDirError, match="num_hidden_layers") as ei:
        load_spec(tmp_path)
    assert str(tmp_path) not in ei.value.public_message


def test_public_message_strips_paths_from_older_errors():
    e = ModelDirError("/srv/models/secret-name/config.json: not valid JSON (line 1)")
    assert e.public_message == "config.json: not valid JSON (line 1)"
    assert "/srv" in str(e)


def test_the_good_model_still_loads(good_dir):
    e = load_decoder(good_dir, cache_dir=False, quiet=True, max_context=32)
    try:
        assert e.complete(PROMPT).usage["completion_tokens"] >= 1
    finally:
        e.close()
