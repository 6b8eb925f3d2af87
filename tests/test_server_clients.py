"""Popular clients, unmodified, against one live server (tests/client_fixtures.py): lenient
parameters through openai's extra_body and LangChain's ChatOpenAI, the Anthropic Messages API
through the official `anthropic` SDK, OpenAI's Responses API through `openai`, thinking control
and the reasoning split."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import client_fixtures as cf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
QWEN = "tiny-qwen3"


@pytest.fixture(scope="module")
def live(tmp_path_factory, one_thread):
    server, reg = cf.start(tmp_path_factory.mktemp("clients"))
    with server as srv:
        srv.registry = reg
        yield srv


@pytest.fixture(scope="module")
def oai(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)


def _chat(oai, **kw) -> str:
    r = oai.chat.completions.create(model=QWEN, messages=[{"role": "user", "content": "hello"}],
                                    max_tokens=8, **kw)
    return r.choices[0].message.content


# --- 1. lenient parameters ------------------------------------------------------------------------
def test_sampling_extras_are_honoured(oai):
    greedy = _chat(oai, temperature=0)
    # top_k 1 and min_p 1 keep only the most likely token: sampling at temperature 1 is greedy
    assert _chat(oai, temperature=1.0, seed=7, extra_body={"top_k": 1}) == greedy
    assert _chat(oai, temperature=1.0, seed=7, extra_body={"min_p": 1.0}) == greedy
    wide = {_chat(oai, temperature=1.5, seed=s) for s in range(4)}
    assert len(wide) > 1                   # ... which plain sampling at this temperature is not


def test_repetition_penalty_reaches_the_engine(oai, live):
    from torch_xdna.engine.llm.generate import GenerationConfig
    got = _chat(oai, temperature=0, extra_body={"repetition_penalty": 1.8})
    model = live.registry.loaded[QWEN]
    ids = model.chat_prompt([{"role": "user", "content": "hello"}])
    want = model.engine.complete(ids, GenerationConfig(max_tokens=8, repetition_penalty=1.8)).text
    assert got == want and got != _chat(oai, temperature=0)


def test_min_p_matches_transformers_warper():
    from transformers.generation.logits_process import MinPLogitsWarper
    from torch_xdna.engine.llm.logits import MinP
    torch.manual_seed(1)
    logits = torch.randn(50) * 3
    for p in (0.05, 0.3, 0.9):
        ours = MinP(p)(logits.clone())
        ref = MinPLogitsWarper(p)(None, logits.clone()[None])[0]
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))


def test_unknown_fields_ignored_with_one_warning_each(oai, caplog):
    extras = {"metadata": {"a": "b"}, "store": False, "typical_p": 0.9, "best_of": 1}
    with caplog.at_level(logging.WARNING, logger="torch_xdna.server"):
        for _ in range(2):
            _chat(oai, temperature=0, extra_body=extras)
    warned = [r.getMessage() for r in caplog.records if "unknown request field" in r.getMessage()]
    assert sorted(warned) == sorted(f"ignoring the unknown request field {n!r} (warned once per "
                                    f"field name)" for n in extras)
    # nested extras (cache_control on a content part) too; empty tools are no tools
    r = oai.chat.completions.create(model=QWEN, max_tokens=4, tools=[], messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}])
    assert r.choices[0].finish_reason in ("stop", "length")


def test_strict_types_kept(oai):
    for bad in ({"top_k": "many"}, {"min_p": 2}, {"repetition_penalty": 0}):
        with pytest.raises(openai.BadRequestError) as e:
            _chat(oai, extra_body=bad)
        assert e.value.code == "invalid_value" and e.value.param == next(iter(bad))


def test_langchain_chat_openai(live):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=live.url + "/v1", api_key="x", model=QWEN, temperature=0,
                     max_tokens=8, max_retries=0, extra_body={"top_k": 1, "min_p": 0.1})
    msg = llm.invoke("hello")
    assert msg.content == _chat(openai.OpenAI(base_url=live.url + "/v1", api_key="x"),
                                temperature=0)
    streamed = "".join(c.content for c in llm.stream("hello"))
    assert streamed == msg.content
