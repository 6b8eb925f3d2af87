"""Popular clients, unmodified, against one live server (tests/client_fixtures.py): lenient
parameters through openai's extra_body and LangChain's ChatOpenAI, the Anthropic Messages API
through the official `anthropic` SDK, OpenAI's Responses API through `openai`, thinking control
and the reasoning split."""
from __future__ import annotations

import json
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
GREEDY = {"temperature": 0}


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


# --- 2. Anthropic Messages API (the official anthropic SDK) --------------------------------------
@pytest.fixture(scope="module")
def ant(live):
    import anthropic
    return anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0)


def test_anthropic_text_system_multi_turn_and_usage(ant, live, oai):
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "how are you"}]}]
    # this SDK has no sampling arguments any more; the server still takes them (extra_body)
    r = ant.messages.create(model=QWEN, max_tokens=8, system="be brief", messages=msgs,
                            extra_body=GREEDY)
    same = oai.chat.completions.create(model=QWEN, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "be brief"}, *msgs[:2], {"role": "user",
                                                                "content": "how are you"}])
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == same.choices[0].message.content        # the same generation path
    assert r.usage.input_tokens == same.usage.prompt_tokens
    assert r.usage.output_tokens == same.usage.completion_tokens
    assert r.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
        same.choices[0].finish_reason]
    n = ant.messages.count_tokens(model=QWEN, system="be brief", messages=msgs)
    assert n.input_tokens == same.usage.prompt_tokens


def test_anthropic_stream_matches_the_message(ant):
    kw = dict(model=QWEN, max_tokens=8, extra_body=GREEDY,
              messages=[{"role": "user", "content": "hello"}])
    whole = ant.messages.create(**kw)
    with ant.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == \
        whole.usage.output_tokens


def test_anthropic_stop_sequence(ant):
    r = ant.messages.create(model="plain", max_tokens=50, stop_sequences=["there"],
                            messages=[{"role": "user", "content": "hi"}])
    assert (r.content[0].text, r.stop_reason, r.stop_sequence) == ("Hello ", "stop_sequence",
                                                                  "there")
    r = ant.messages.create(model="plain", max_tokens=50,
                            messages=[{"role": "user", "content": "hi"}])
    assert (r.content[0].text, r.stop_reason, r.stop_sequence) == ("Hello there!", "end_turn",
                                                                  None)


def test_anthropic_tools_use_and_result(ant, live):
    tool = {"name": "weather", "description": "weather of a city",
            "input_schema": cf.WEATHER["function"]["parameters"]}
    ask = [{"role": "user", "content": "weather in paris?"}]
    # forced (grammar) on the tiny Qwen3: always a valid call
    r = ant.messages.create(model=QWEN, max_tokens=40, tools=[tool], messages=ask,
                            tool_choice={"type": "tool", "name": "weather"})
    assert r.stop_reason == "tool_use"
    use = [b for b in r.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "weather" and use[0].input["city"] in ("Paris", "Oslo")
    # the scripted model: thinks, writes text, calls the tool (prompt convention)
    r = ant.messages.create(model="script", max_tokens=200, tools=[tool], messages=ask)
    assert [b.type for b in r.content] == ["thinking", "text", "tool_use"]
    assert r.content[0].thinking == "The user wants the weather."
    assert r.content[1].text.strip() == "Let me check."
    assert r.content[2].input == {"city": "Oslo"} and r.stop_reason == "tool_use"
    with ant.messages.stream(model="script", max_tokens=200, tools=[tool], messages=ask) as s:
        final = s.get_final_message()
    strip = lambda bs: [{k: v for k, v in b.model_dump().items() if k != "id"} for b in bs]  # noqa
    assert strip(final.content) == strip(r.content) and final.stop_reason == "tool_use"
    # the result goes back as a tool turn in the model's convention
    follow = ask + [{"role": "assistant", "content": r.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id":
                                                  r.content[2].id, "content": "sunny, 21C"}]}]
    ant.messages.create(model="script", max_tokens=200, tools=[tool], messages=follow)
    prompt = live.registry.loaded["script"].prompts[-1]
    assert prompt[-1] == {"role": "user", "content": "```tool_output\nsunny, 21C\n```"}
    assert '"name": "weather"' in prompt[-2]["content"]


def test_anthropic_errors_and_x_api_key(live):
    import anthropic
    ant = anthropic.Anthropic(base_url=live.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as e:
        ant.messages.create(model="nope", max_tokens=4, messages=[{"role": "user",
                                                                    "content": "hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    r = httpx.post(live.url + "/v1/messages", json={"model": QWEN, "messages": []})
    assert r.status_code == 400 and r.json()["type"] == "error"


# --- 2. OpenAI Responses API (the official openai client) ----------------------------------------
def test_responses_text_matches_chat_and_streams(oai):
    r = oai.responses.create(model=QWEN, input="hello", max_output_tokens=8, temperature=0,
                             instructions="be brief")
    same = oai.chat.completions.create(model=QWEN, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}])
    assert r.output_text == same.choices[0].message.content
    assert r.usage.input_tokens == same.usage.prompt_tokens
    assert r.status == ("incomplete" if same.choices[0].finish_reason == "length" else "completed")
    events = list(oai.responses.create(model=QWEN, input="hello", max_output_tokens=8,
                                       temperature=0, instructions="be brief", stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    last = events[-1]              # response.completed, or .incomplete at max_output_tokens
    assert last.type == "response." + r.status
    assert "".join(deltas) == last.response.output_text == r.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_tools_and_reasoning(oai):
    tool = {"type": "function", "name": "weather", "description": "weather of a city",
            "parameters": cf.WEATHER["function"]["parameters"]}
    r = oai.responses.create(model="script", input="weather in paris?", tools=[tool])
    kinds = [o.type for o in r.output]
    assert kinds == ["reasoning", "message", "function_call"]
    assert r.output[0].content[0].text == "The user wants the weather."
    call = r.output[2]
    assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Oslo"})
    with oai.responses.stream(model="script", input="weather in paris?", tools=[tool]) as s:
        final = s.get_final_response()
    assert [o.type for o in final.output] == ["message", "reasoning", "function_call"]
    # the call's output goes back as a tool turn
    follow = [{"role": "user", "content": "weather in paris?"},
              {"type": "function_call", "call_id": call.call_id, "name": "weather",
               "arguments": call.arguments},
              {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    oai.responses.create(model="script", input=follow, tools=[tool])
    # forced call through the grammar on the tiny Qwen3
    r = oai.responses.create(model=QWEN, input="weather in paris?", tools=[tool],
                             tool_choice={"type": "function", "name": "weather"},
                             max_output_tokens=40)
    assert [o.type for o in r.output][-1] == "function_call"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=QWEN, input="hi", previous_response_id="resp_1")
    assert e.value.param == "previous_response_id"


# --- 3. thinking ----------------------------------------------------------------------------------
def _template_len(path, msgs, **kw) -> int:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    return len(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                       return_dict=False, **kw))


def test_enable_thinking_reaches_the_template(oai, live):
    path = live.registry.entries[QWEN].path
    msgs = [{"role": "user", "content": "hello"}]
    off = oai.chat.completions.create(model=QWEN, messages=msgs, max_tokens=2, temperature=0,
                                      extra_body={"chat_template_kwargs": {"enable_thinking":
                                                                           False}})
    on = oai.chat.completions.create(model=QWEN, messages=msgs, max_tokens=2, temperature=0)
    assert off.usage.prompt_tokens == _template_len(path, msgs, enable_thinking=False)
    assert on.usage.prompt_tokens == _template_len(path, msgs) < off.usage.prompt_tokens
    import ollama
    c = ollama.Client(host=live.url)
    r = c.chat(model=QWEN, messages=msgs, think=False, options={"num_predict": 2})
    assert r.prompt_eval_count == off.usage.prompt_tokens


def test_reasoning_split_on_every_api(oai, live):
    msgs = [{"role": "user", "content": "weather?"}]
    thought = "The user wants the weather."
    r = oai.chat.completions.create(model="script", messages=msgs)
    assert r.choices[0].message.model_extra["reasoning_content"] == thought
    assert r.choices[0].message.content.startswith("Let me check.")
    chunks = list(oai.chat.completions.create(model="script", messages=msgs, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == r.choices[0].message.content
    import ollama
    c = ollama.Client(host=live.url)
    o = c.chat(model="script", messages=msgs, think=True)
    assert o.message.thinking == thought and o.message.content.startswith("Let me check.")
    parts = list(c.chat(model="script", messages=msgs, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == thought


# --- 4. Ollama fields, CORS, GET / ----------------------------------------------------------------
def _resident(live) -> list[str]:
    return [m["name"] for m in httpx.get(live.url + "/api/ps").json()["models"]]


def _wait_until(check, timeout=10.0) -> bool:
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_ollama_keep_alive(live):
    import ollama
    c = ollama.Client(host=live.url)
    opts = {"num_predict": 2, "temperature": 0}
    c.generate(model=QWEN, prompt="hi", options=opts, keep_alive=-1)
    ps = httpx.get(live.url + "/api/ps").json()["models"]
    assert [m["expires_at"] for m in ps if m["name"] == QWEN] == [None]
    c.chat(model=QWEN, messages=[{"role": "user", "content": "hi"}], options=opts, keep_alive=0)
    assert _wait_until(lambda: QWEN not in _resident(live))          # 0: unloaded after it
    c.generate(model=QWEN, prompt="hi", options=opts, keep_alive="1s")
    assert QWEN in _resident(live)
    assert _wait_until(lambda: QWEN not in _resident(live), 15)       # then after a second
    assert c.generate(model=QWEN, prompt="").done_reason == "load"    # an empty prompt loads
    assert QWEN in _resident(live)
    assert c.generate(model=QWEN, prompt="", keep_alive=0).done_reason == "unload"
    assert _wait_until(lambda: QWEN not in _resident(live))
    r = httpx.post(live.url + "/api/generate", json={"model": QWEN, "keep_alive": "soon"})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]


def test_suffix_fill_in_the_middle(oai, live):
    from tokenizers import Tokenizer
    from torch_xdna.engine.llm.generate import GenerationConfig
    path = live.registry.entries[QWEN].path
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    pre, suf = "the quick brown ", " over the lazy dog"
    ids = [tok.token_to_id(cf.FIM[0]), *tok.encode(pre, add_special_tokens=False).ids,
           tok.token_to_id(cf.FIM[1]), *tok.encode(suf, add_special_tokens=False).ids,
           tok.token_to_id(cf.FIM[2])]
    r = oai.completions.create(model=QWEN, prompt=pre, suffix=suf, max_tokens=6, temperature=0)
    model = live.registry.loaded[QWEN]
    want = model.engine.complete(ids, GenerationConfig(max_tokens=6))
    assert r.choices[0].text == want.text and r.usage.prompt_tokens == len(ids)
    import ollama
    o = ollama.Client(host=live.url).generate(model=QWEN, prompt=pre, suffix=suf,
                                               options={"temperature": 0, "num_predict": 6})
    assert o.response == want.text
    with pytest.raises(openai.BadRequestError) as e:        # no FIM tokens: a clear 400
        oai.completions.create(model="plain", prompt=pre, suffix=suf)
    assert e.value.param == "suffix"


def test_get_root_and_ollama_error_shape(live):
    assert httpx.get(live.url + "/").text == "Ollama is running"
    r = httpx.post(live.url + "/api/chat", json={"model": "nope", "messages": []})
    assert r.status_code == 404 and r.json() == {"error": "model 'nope' not found"}
    r = httpx.get(live.url + "/api/nothing")
    assert r.status_code == 404 and set(r.json()) == {"error"}


PREFLIGHT = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os,"
                                               "x-stainless-lang,x-api-key,anthropic-version"}


@pytest.mark.parametrize("key", [None, "K"])
def test_browser_preflight_with_and_without_a_key(key):
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    reg = ModelRegistry()
    reg.add_object(cf.ScriptChat("Hi!"), "chat", "plain")
    app = create_app(ServerConfig(default_model=False, api_key=key,
                                  cors_origins=["http://localhost:3000"]), registry=reg)
    with BackgroundServer(app) as s:
        for path in ("/v1/chat/completions", "/v1/messages", "/api/chat"):
            r = httpx.options(s.url + path, headers=PREFLIGHT)
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
            allowed = r.headers["access-control-allow-headers"].lower()
            assert all(h in allowed for h in ("x-stainless-os", "x-api-key", "authorization"))
        body = {"model": "plain", "messages": [{"role": "user", "content": "hi"}]}
        origin = {"Origin": "http://localhost:3000"}
        r = httpx.post(s.url + "/v1/chat/completions", json=body, headers=origin)
        assert r.status_code == (401 if key else 200)
        assert r.headers.get("access-control-allow-origin") == "http://localhost:3000"
        if key:
            r = httpx.post(s.url + "/v1/messages", json={**body, "max_tokens": 5},
                           headers={**origin, "x-api-key": key, "anthropic-version": "2023-06-01"})
            assert r.status_code == 200 and r.json()["content"][0]["text"] == "Hi!"
            r = httpx.post(s.url + "/v1/messages", json={**body, "max_tokens": 5})
            assert r.json()["error"]["type"] == "authentication_error"


# --- 5. names and context -------------------------------------------------------------------------
def test_aliases_duplicates_and_one_context_length(live, tmp_path):
    from torch_xdna.models.hf import ModelDirError
    from torch_xdna.server.app import ServerConfig, create_app
    from torch_xdna.server.background import BackgroundServer
    from torch_xdna.server.registry import ModelRegistry
    qwen = live.registry.entries[QWEN].path
    with pytest.raises(ModelDirError, match="given twice"):
        create_app(ServerConfig(models=[f"chat={qwen}", f"chat={qwen}"], preload=False))
    with pytest.raises(ValueError, match="no served model"):
        create_app(ServerConfig(aliases=["gpt=nope"], preload=False))
    reg = ModelRegistry(max_context=200)
    reg.add_default_embedding()
    reg.add_dir(qwen, "chat")
    app = create_app(ServerConfig(default_model=False, preload=False, aliases=[
        "text-embedding-3-small=all-MiniLM-L6-v2", "gpt-4o=chat"]), registry=reg)
    with BackgroundServer(app) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        e = client.embeddings.create(model="text-embedding-3-small", input="hello")
        assert len(e.data[0].embedding) == 384
        assert client.models.retrieve("gpt-4o").id == "chat"
        before = client.models.retrieve("chat").model_extra["max_model_len"]
        assert before == 200                         # not yet resident: --max-context
        r = client.chat.completions.create(model="gpt-4o", max_tokens=2, messages=[
            {"role": "user", "content": "hi"}])
        ctx = reg.loaded["chat"].context_length
        assert client.models.retrieve("chat").model_extra["max_model_len"] == ctx
        show = httpx.post(s.url + "/api/show", json={"model": "chat"}).json()
        assert show["model_info"]["qwen3.context_length"] == ctx
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="chat", max_tokens=ctx, messages=[
                {"role": "user", "content": "hi"}])
        assert str(ctx) in err.value.message and r.model == "chat"
