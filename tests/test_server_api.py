"""Tool calling, structured output, logprobs, n, penalties through the official openai client,
and the Ollama API through the official ollama client, on one live server (tiny random-weight
Qwen3 with a Qwen3-style tools template, the bundled embedding model, a scripted fake); plus the
tool-call parser on synthetic model outputs of each convention."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import ollama
import openai
import pytest
import torch

from torch_xdna.server.app import ServerConfig, create_app
from torch_xdna.server.background import BackgroundServer
from torch_xdna.server.registry import ModelRegistry
from torch_xdna.server.tools import (ToolStream, convention_of, parse_tool_calls,
                                     render_messages)

sys.path.insert(0, str(Path(__file__).parent))

# Qwen3's tool conventions (the <tools> system block, <tool_call> JSON, <tool_response> turns),
# with its instructions shortened: the test tokenizer spends about a token per character
QWEN3_TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
Calls: <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}{% for tc in m.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object",
                                      "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                                      "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "time", "parameters": {"type": "object",
                                   "properties": {"tz": {"type": "integer", "maximum": 12}},
                                   "required": ["tz"], "additionalProperties": False}}}
MSGS = [{"role": "user", "content": "weather in paris?"}]


class ScriptChat:
    """A ChatModel that answers with a fixed text, a few characters per piece (no template:
    the prompt tool convention)."""

    context_length = 4096

    def __init__(self, text: str):
        self.text = text
        self.prompts: list[list[dict]] = []

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def chat_prompt(self, messages):
        self.prompts.append(messages)
        return self.encode("".join(f"<{m['role']}>{m['content']}" for m in messages))

    def stream(self, prompt_ids, params, cancelled):
        for i in range(0, len(self.text), 3):
            yield self.text[i:i + 3]


SCRIPTED = ('Let me check.\n```tool_call\n{"name": "weather", "arguments": '
            '{"city": "Oslo"}}\n```')


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    import llm_fixtures
    qwen = tmp_path_factory.mktemp("llm") / "tiny-qwen3"
    llm_fixtures.build_model("qwen3", qwen, seed=5)
    # retrain the tokenizer with tool JSON in its corpus, so tool prompts take fewer tokens
    text = llm_fixtures.TEXT
    try:
        llm_fixtures.TEXT = text + (json.dumps([WEATHER, TIME]) + SCRIPTED
                                    + QWEN3_TOOLS_TEMPLATE) * 10
        llm_fixtures.save_tokenizer(qwen)
    finally:
        llm_fixtures.TEXT = text
    cfg_path = qwen / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = QWEN3_TOOLS_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    reg = ModelRegistry(max_models=3)
    reg.add_default_embedding()
    reg.add_dir(qwen)
    script = ScriptChat(SCRIPTED)
    reg.add_object(script, "chat", "script")
    app = create_app(ServerConfig(default_model=False), registry=reg)
    with BackgroundServer(app) as srv:
        srv.script = script
        yield srv


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="x", max_retries=0)


# --- parser on synthetic outputs ------------------------------------------------------------------
def test_parse_tool_calls_each_convention():
    content, calls = parse_tool_calls(
        'Sure.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "time", "arguments": {"tz": 3}}\n</tool_call>', "hermes")
    assert content == "Sure." and [c.name for c in calls] == ["weather", "time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    content, calls = parse_tool_calls(
        '<|python_tag|>{"name": "time", "parameters": {"tz": 1}}; '
        '{"name": "weather", "parameters": {"city": "a;b"}}', "llama3")
    assert content is None and [json.loads(c.arguments) for c in calls] == [{"tz": 1},
                                                                              {"city": "a;b"}]
    content, calls = parse_tool_calls(SCRIPTED, "prompt")
    assert content == "Let me check." and calls[0].name == "weather"
    # failing soft: malformed JSON, unknown tool, no call at all -> plain content
    bad = '<tool_call>\n{"name": "weather", "arguments": {"city": </tool_call>'
    assert parse_tool_calls(bad, "hermes") == (bad, [])
    other = '{"name": "rm_rf", "parameters": {}}'
    assert parse_tool_calls(other, "llama3", names={"time"}) == (other, [])
    assert parse_tool_calls("just words", "prompt") == ("just words", [])


@pytest.mark.parametrize("conv,text", [
    ("hermes", 'Hi <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'),
    ("prompt", SCRIPTED),
    ("llama3", '{"name": "f", "parameters": {"a": 1}}'),
    ("hermes", "no call here <tool_ at the end"),
])
def test_tool_stream_matches_the_whole_text_parse(conv, text):
    for step in (1, 4):
        ts = ToolStream(conv)
        out = "".join(ts.feed(text[i:i + step]) for i in range(0, len(text), step))
        rest, calls = ts.finish()
        content, want = parse_tool_calls(text, conv)
        assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in want]
        if calls:
            assert (out + rest).strip() == (content or "")
            assert "tool_call" not in out and '"name"' not in out    # never leaked as content
        else:
            assert out + rest == text


def test_template_rendering_of_tools_and_tool_results():
    from torch_xdna.models.tokenizer import compile_template
    msgs = MSGS + [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    assert convention_of(QWEN3_TOOLS_TEMPLATE) == "hermes"
    out, extra = render_messages(msgs, [WEATHER], "hermes")
    text = compile_template(QWEN3_TOOLS_TEMPLATE).render(messages=out, add_generation_prompt=True,
                                                         **extra)
    assert '"name": "weather"' in text and "<tools>" in text
    assert '{"name": "weather", "arguments": {"city": "Paris"}}' in text
    assert "<tool_response>\n18 C\n</tool_response>" in text
    out, extra = render_messages(msgs, [WEATHER], "prompt")      # Gemma 3: a prompt convention
    assert extra == {} and out[0]["role"] == "system" and "```tool_call" in out[0]["content"]
    assert out[2]["content"].startswith("```tool_call\n") and out[3] == {
        "role": "user", "content": "```tool_output\n18 C\n```"}


# --- end to end -----------------------------------------------------------------------------------
def test_tool_choice_required_and_named_give_valid_calls(client):
    r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, tools=[WEATHER, TIME],
                                       tool_choice="required", max_tokens=60, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    tool = {"weather": WEATHER, "time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    stream = client.chat.completions.create(
        model="tiny-qwen3", messages=MSGS, tools=[TIME], max_tokens=40, temperature=0.8,
        seed=3, tool_choice={"type": "function", "function": {"name": "time"}}, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "time" and calls[0].index == 0
    jsonschema.validate(json.loads(calls[0].function.arguments), TIME["function"]["parameters"])
    assert not any("tool_call" in (d.content or "") for d in deltas)


def test_tool_choice_auto_parses_calls_and_tool_results_render(client, live):
    r = client.chat.completions.create(model="script", messages=MSGS, tools=[WEATHER])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Let me check."
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"city": "Oslo"}
    stream = client.chat.completions.create(model="script", messages=MSGS, tools=[WEATHER],
                                            stream=True)
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert content.strip() == "Let me check." and calls[0].function.name == "weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the call and its result go back in: rendered (prompt convention) and answered
    follow = MSGS + [ch.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": ch.message.tool_calls[0].id,
                      "content": "-3 C"}]
    client.chat.completions.create(model="script", messages=follow, tools=[WEATHER])
    sent = live.script.prompts[-1]
    assert sent[-1] == {"role": "user", "content": "```tool_output\n-3 C\n```"}
    # tool_choice none: no tools offered, no parsing
    r = client.chat.completions.create(model="script", messages=MSGS, tools=[WEATHER],
                                       tool_choice="none")
    assert r.choices[0].message.content == SCRIPTED and r.choices[0].finish_reason == "stop"
    assert "```tool_call" not in live.script.prompts[-1][0]["content"]
    # the real model with tool_choice auto answers; whatever it says, never a 500
    r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, tools=[WEATHER],
                                       max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_json_schema_response_validates(client):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                               "score": {"type": "integer", "minimum": 0,
                                                         "maximum": 99}},
              "required": ["answer", "score"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema,
                                                  "strict": True}}
    for seed in (1,):
        r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, max_tokens=40,
                                           temperature=1.0, seed=seed, response_format=fmt)
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny-qwen3", messages=MSGS, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}})
    assert e.value.param == "response_format"


def test_logprobs_n_penalties_and_bias(client):
    r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens == 4
    for t in lp:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token   # greedy
        assert t.logprob <= 0 and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6
        assert t.bytes == list(t.token.encode())
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    stream = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, max_tokens=4,
                                            temperature=0, logprobs=True, stream=True)
    streamed = [t.token for c in stream if c.choices and c.choices[0].logprobs
                for t in c.choices[0].logprobs.content]
    assert streamed == [t.token for t in lp]
    c = client.completions.create(model="tiny-qwen3", prompt="the quick", max_tokens=3,
                                  temperature=0, logprobs=2)
    assert len(c.choices[0].logprobs.tokens) == 3
    assert all(len(d) == 2 for d in c.choices[0].logprobs.top_logprobs)
    # n=3: three choices after one prefill; usage counts the prompt once
    r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, max_tokens=5, n=3,
                                       temperature=1.0, seed=4)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert 3 <= r.usage.completion_tokens <= 15 and len({ch.message.content
                                                          for ch in r.choices}) > 1
    stream = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, max_tokens=3, n=2,
                                            temperature=1.0, seed=4, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}
    assert chunks[-1].usage.completion_tokens <= 6 and chunks[-1].choices == []
    # logit_bias pins a token; penalties and max_completion_tokens are honored
    r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, max_tokens=3,
                                       temperature=0, logit_bias={"77": 100}, logprobs=True)
    toks = r.choices[0].logprobs.content
    assert len({t.token for t in toks}) == 1 and toks[0].logprob > -1e-3
    r = client.chat.completions.create(model="tiny-qwen3", messages=MSGS, temperature=0,
                                       presence_penalty=2.0, frequency_penalty=0.5,
                                       max_completion_tokens=6, logprobs=True)
    toks = [t.token for t in r.choices[0].logprobs.content]
    assert len(toks) <= 6 and len(set(toks)) == len(toks)      # penalized: no repeats


def test_unsupported_features_on_a_plain_model_are_400(client):
    r = client.chat.completions.create(model="script", messages=MSGS, n=2)   # n: emulated
    assert [c.message.content for c in r.choices] == [SCRIPTED] * 2
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="script", messages=MSGS, logprobs=True)
    assert e.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="script", messages=MSGS, tools=[WEATHER],
                                       tool_choice={"type": "function",
                                                    "function": {"name": "nope"}})
    assert e.value.param == "tool_choice" or "nope" in str(e.value)


# --- Ollama API -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oll(live):
    return ollama.Client(host=live.url, timeout=120)


def test_ollama_version_tags_show(oll):
    assert oll._client.get("/api/version").json()["version"]
    names = {m.model for m in oll.list().models}
    assert {"tiny-qwen3", "all-MiniLM-L6-v2", "script"} <= names
    s = oll.show("tiny-qwen3:latest")
    assert "tools" in s.capabilities and "<tool_call>" in s.template
    assert s.modelinfo["qwen3.context_length"] == 512 and s.details.family == "qwen3"
    with pytest.raises(ollama.ResponseError) as e:
        oll.show("nope")
    assert e.value.status_code == 404


def test_ollama_chat_and_generate_stream_ndjson(oll):
    opts = {"temperature": 0, "num_predict": 6}
    r = oll.chat(model="tiny-qwen3", messages=MSGS, options=opts)
    assert r.done and r.done_reason in ("stop", "length") and r.message.role == "assistant"
    assert 0 < r.eval_count <= 6 and r.prompt_eval_count > 0 and r.total_duration > 0
    parts = list(oll.chat(model="tiny-qwen3", messages=MSGS, options=opts, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == r.message.content   # greedy
    g = oll.generate(model="tiny-qwen3", prompt="the quick", options=opts)
    gs = list(oll.generate(model="tiny-qwen3", prompt="the quick", options=opts, stream=True))
    assert "".join(p.response for p in gs) == g.response and gs[-1].eval_count == g.eval_count
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    j = oll.generate(model="tiny-qwen3", prompt="ok?", format=schema,
                     options={"temperature": 0, "num_predict": 30})
    jsonschema.validate(json.loads(j.response), schema)
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="missing:7b", messages=MSGS)
    assert e.value.status_code == 404


def test_ollama_embed_matches_the_engine(oll, live):
    emb = live.app.state.server.registry.loaded["all-MiniLM-L6-v2"]
    texts = ["hello world", "the cat sat on the mat"]
    r = oll.embed(model="all-MiniLM-L6-v2", input=texts)
    torch.testing.assert_close(torch.tensor(r.embeddings), emb.embed(texts), atol=2e-5, rtol=0)
    assert r.prompt_eval_count > 0
    one = oll.embeddings(model="all-MiniLM-L6-v2", prompt="hello world")
    torch.testing.assert_close(torch.tensor(one.embedding), emb.embed(["hello world"])[0],
                               atol=2e-5, rtol=0)


def test_ollama_tool_calls(oll):
    r = oll.chat(model="script", messages=MSGS, tools=[WEATHER])
    assert r.message.tool_calls[0].function.name == "weather"
    assert r.message.tool_calls[0].function.arguments == {"city": "Oslo"}
    parts = list(oll.chat(model="script", messages=MSGS, tools=[WEATHER], stream=True))
    calls = [c for p in parts for c in (p.message.tool_calls or [])]
    assert calls and calls[0].function.arguments == {"city": "Oslo"}
    assert "tool_call" not in "".join(p.message.content or "" for p in parts)


@pytest.mark.parametrize("conv", ["hermes", "llama3", "prompt"])
def test_forced_call_grammar_always_parses(conv, tmp_path):
    """Random walks through the forced-call grammar of each convention (any allowed token,
    uniformly): every finished output parses into a call of an offered tool whose arguments
    validate."""
    import random

    from llm_fixtures import save_tokenizer
    from tokenizers import Tokenizer

    from torch_xdna.engine.llm.constrained import Grammar, processor_factory
    from torch_xdna.server.tools import call_grammar
    save_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    vocab, eos = 400, 2
    make = processor_factory(Grammar("lark", call_grammar([WEATHER, TIME], conv)), tok.to_str(),
                             vocab, eos)
    rng = random.Random(0)
    tools = {"weather": WEATHER, "time": TIME}
    for _ in range(3):
        proc, ids = make(), []
        for _ in range(300):
            allowed = torch.isfinite(proc(torch.zeros(vocab))).nonzero().flatten().tolist()
            t = rng.choice(allowed)
            proc.accept(t)
            if t == eos:
                break
            ids.append(t)
            if proc.finished():
                break
        assert proc.finished() or t == eos
        content, calls = parse_tool_calls(tok.decode(ids), conv, set(tools))
        assert len(calls) == 1 and not content, tok.decode(ids)
        jsonschema.validate(json.loads(calls[0].arguments),
                            tools[calls[0].name]["function"]["parameters"])


@pytest.mark.parametrize("conv", ["hermes", "llama3", "prompt"])
def test_forced_parallel_calls_grammar_parses_into_several_calls(conv, tmp_path):
    """tool_choice "required" with parallel_tool_calls: random walks through the grammar of up
    to 3 calls each parse into 1-3 calls of offered tools with valid arguments."""
    import random

    from llm_fixtures import save_tokenizer
    from tokenizers import Tokenizer

    from torch_xdna.engine.llm.constrained import Grammar, processor_factory
    from torch_xdna.server.tools import call_grammar
    save_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    vocab, eos = 400, 2
    make = processor_factory(Grammar("lark", call_grammar([WEATHER, TIME], conv, 3)),
                             tok.to_str(), vocab, eos)
    rng = random.Random(1)
    tools = {"weather": WEATHER, "time": TIME}
    counts = []
    for _ in range(6):
        proc, ids = make(), []
        for _ in range(600):
            allowed = torch.isfinite(proc(torch.zeros(vocab))).nonzero().flatten().tolist()
            t = rng.choice(allowed)
            proc.accept(t)
            if t == eos:
                break
            ids.append(t)
            if proc.finished():
                break
        content, calls = parse_tool_calls(tok.decode(ids), conv, set(tools))
        assert 1 <= len(calls) <= 3 and not content, tok.decode(ids)
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), tools[c.name]["function"]["parameters"])
        counts.append(len(calls))
    assert max(counts) > 1, counts


def test_parallel_tool_calls_false_forces_exactly_one_call(client):
    for parallel in (False, True):
        r = client.chat.completions.create(
            model="tiny-qwen3", messages=MSGS, tools=[WEATHER, TIME], tool_choice="required",
            parallel_tool_calls=parallel, max_tokens=120, temperature=0.9, seed=11)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert 1 <= len(ch.message.tool_calls) <= (4 if parallel else 1)


def test_follow_up_turn_reports_prefix_cache_hits(client):
    """A second request sharing a long system prompt reuses its KV blocks (engine/llm/prefix_cache.py)
    and says so in OpenAI's usage.prompt_tokens_details.cached_tokens."""
    system = {"role": "system", "content": "You are a careful assistant. " * 8}
    first = client.chat.completions.create(model="tiny-qwen3", max_tokens=2, temperature=0,
                                           messages=[system, {"role": "user", "content": "hi"}])
    again = client.chat.completions.create(model="tiny-qwen3", max_tokens=2, temperature=0,
                                           messages=[system, {"role": "user", "content": "yo"}])
    assert again.usage.prompt_tokens >= 64
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 64 <= cached < again.usage.prompt_tokens and cached % 64 == 0
    assert first.usage.prompt_tokens_details is None or \
        (first.usage.prompt_tokens_details.cached_tokens or 0) < cached
