"""Serving models from the files users have (server/registry.py): a GGUF file with the original
tokenizer directory (`--model NAME=FILE.gguf,tokenizer=DIR`), every --model checked at startup
(`xdna serve` exits 2 with one line on a bad one, also for a GGUF whose tokenizer cannot be
rebuilt), a model that fails to load later answers with its cause and the fix in OpenAI's error
shape, CTranslate2 Whisper directories and packaged checkpoints' names are recognized."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gguf_fixtures import write_gguf  # noqa: E402
from llm_fixtures import _config, save_tokenizer  # noqa: E402

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from torch_xdna.models.hf import ModelDirError  # noqa: E402
from torch_xdna.server.app import ServerConfig, create_app  # noqa: E402
from torch_xdna.server.registry import (ModelEntry, ModelRegistry, load_failure,  # noqa: E402
                                        split_tokenizer)

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def bert_tok_gguf(tmp_path_factory):
    """A tiny Qwen3 GGUF whose tokenizer model ('bert') cannot be rebuilt, and the original
    tokenizer directory that fixes it."""
    import torch
    from transformers import AutoModelForCausalLM
    d = tmp_path_factory.mktemp("gguf-serve")
    tok = d / "tok"
    tok.mkdir()
    save_tokenizer(tok)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config("qwen3")).float().eval()

    def bert(w):
        w.add_tokenizer_model("bert")
        w.add_token_list(["[PAD]", "a"])
    return write_gguf(model, "qwen3", d / "bert-tok.gguf", "F16", bert), tok


def test_split_tokenizer_suffix(tmp_path):
    assert split_tokenizer("m.gguf,tokenizer=/x/tok") == ("m.gguf", "/x/tok")
    assert split_tokenizer("m.gguf") == ("m.gguf", None)
    odd = tmp_path / "a,tokenizer=b"
    odd.mkdir()
    assert split_tokenizer(str(odd)) == (str(odd), None)     # an existing path is never split
    from torch_xdna.server.config import parse_model_arg
    assert parse_model_arg("smol=m.gguf,tokenizer=/t") == ("smol", "m.gguf,tokenizer=/t")
    assert parse_model_arg("m.gguf,tokenizer=/t") == (None, "m.gguf,tokenizer=/t")


def test_gguf_with_tokenizer_dir_serves_and_without_fails_at_startup(bert_tok_gguf, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("TORCH_XDNA_CACHE_DIR", str(tmp_path / "cache"))
    path, tok = bert_tok_gguf
    with pytest.raises(ModelDirError, match="--tokenizer DIR"):
        create_app(ServerConfig(models=[f"m={path}"], default_model=False, preload=False))
    cfg = ServerConfig(models=[f"m={path},tokenizer={tok}"], default_model=False, preload=False)
    with TestClient(create_app(cfg)) as c:
        r = c.post("/v1/chat/completions", json={"model": "m", "max_tokens": 2,
                                                 "temperature": 0, "messages": MSG})
        assert r.status_code == 200, r.text


def test_xdna_serve_exits_2_on_a_bad_model(bert_tok_gguf, tmp_path, capsys):
    from torch_xdna.cli.main import main
    path, _ = bert_tok_gguf
    trunc = tmp_path / "cut.gguf"
    trunc.write_bytes(path.read_bytes()[:5000])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for bad, needle in ((path, "--tokenizer DIR"), (trunc, "truncated"),
                        (tmp_path / "nope.gguf", "nope.gguf")):
        code = main(["serve", "--no-default-model", "--port", str(port), "--model", str(bad)])
        err = capsys.readouterr().err
        lines = [ln for ln in err.splitlines() if ln.startswith("xdna serve: error: ")]
        assert code == 2 and len(lines) == 1 and needle in lines[0], err
        assert "Traceback" not in err


def test_lazy_load_failure_answers_with_the_cause_and_the_fix():
    reg = ModelRegistry(max_models=1)

    def broken():
        raise ModelDirError("/srv/secret/m/config.json: hidden_size 7 does not match the "
                            "weights", public="config.json: hidden_size 7 does not match the weights")

    def no_pkg():
        raise ModuleNotFoundError("loading GGUF files needs the gguf package: pip install gguf")
    reg.entries["broken"] = ModelEntry("broken", "chat", broken)
    reg.entries["nopkg"] = ModelEntry("nopkg", "chat", no_pkg)
    with TestClient(create_app(ServerConfig(preload=False, default_model=False),
                               registry=reg)) as c:
        for model, cause in (("broken", "hidden_size 7 does not match"),
                             ("nopkg", "pip install gguf")):
            r = c.post("/v1/chat/completions", json={"model": model, "messages": MSG})
            err = r.json()["error"]
            assert r.status_code == 500 and err["code"] == "model_load_failed", r.text
            assert cause in err["message"] and "xdna serve --model" in err["message"]
            assert "/srv" not in r.text and "\n" not in err["message"]
            assert err["type"] == "server_error"
    assert "RuntimeError (the server log" in load_failure("x", RuntimeError("/srv/boom"))


def test_ct2_whisper_dir_and_packaged_names_are_offered():
    from realweights import checkpoint
    ct2 = checkpoint("whisper-base")
    reg = ModelRegistry()
    assert reg.add_dir(ct2, "asr").kind == "asr"
    assert reg.add_dir("whisper-base", "wb").path == ct2         # a packaged name
    smol = reg.add_dir(checkpoint("smollm2-135m-instruct"), "smol")
    assert smol.kind == "chat"
