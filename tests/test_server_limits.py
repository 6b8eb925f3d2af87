"""Bounded work per request (issue #32): every per-request structure has a limit and an over-limit
one is a 400 naming the parameter and the limit; schemas that are too deep, refer only to
themselves or have no finite instance are refused before any token (no device work at all);
grammar-engine errors are one line in our words; request types are strict."""
from __future__ import annotations

import httpx
import pytest

from test_server_batching import MODEL, live  # noqa: F401 - the tiny-decoder server fixture
from torch_xdna.engine.llm import constrained
from torch_xdna.server import schemas

CHAT = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def post(live, extra: dict, route: str = "/v1/chat/completions", base: dict = CHAT):
    return httpx.post(live.url + route, json={**base, **extra}, timeout=120)


def refused(r, param: str, *words: str) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    msg = err["message"]
    assert "\n" not in msg and "Traceback" not in msg and "<state>" not in msg, msg
    for w in words:
        assert w in msg, msg
    return err


def _deep(levels: int) -> dict:
    s: dict = {"type": "string"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def tool(i: int, params: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": params or {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}


def schema_format(schema) -> dict:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}


SELF_REF = {"$ref": "#"}
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
NO_FINITE = {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}


@pytest.mark.parametrize("extra,param,limit", [
    ({"tools": [tool(i) for i in range(schemas.MAX_TOOLS + 1)]}, "tools", schemas.MAX_TOOLS),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", 4),
    ({"stop": ["x" * (schemas.MAX_STOP_CHARS + 1)]}, "stop", schemas.MAX_STOP_CHARS),
    ({"logit_bias": {str(i): 1 for i in range(schemas.MAX_LOGIT_BIAS + 1)}}, "logit_bias",
     schemas.MAX_LOGIT_BIAS),
    ({"n": schemas.MAX_N + 1}, "n", schemas.MAX_N),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", 20),
    (schema_format(_deep(250)), "response_format", constrained.MAX_SCHEMA_DEPTH),
    (schema_format({"enum": list(range(constrained.MAX_SCHEMA_VALUES + 1))}), "response_format",
     constrained.MAX_SCHEMA_VALUES),
    (schema_format({"type": "string", "description": "d" * constrained.MAX_SCHEMA_BYTES}),
     "response_format", constrained.MAX_SCHEMA_BYTES),
])
def test_each_bound_is_a_400_naming_the_parameter_and_limit(live, extra, param, limit):
    refused(post(live, extra), param, str(limit))


def test_just_under_the_bounds_is_served(live):
    r = post(live, {"tools": [tool(i) for i in range(schemas.MAX_TOOLS)], "tool_choice": "none",
                    "stop": ["x" * schemas.MAX_STOP_CHARS],
                    "logit_bias": {str(i): 0.5 for i in range(schemas.MAX_LOGIT_BIAS)}})
    assert r.status_code == 200, r.text
    r = post(live, schema_format(_deep(20)))
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("schema,words", [
    (_deep(250), ["64 levels"]),
    (SELF_REF, ["no finite instance", "the root -> the root"]),
    (CYCLE, ["no finite instance", "$defs.a -> $defs.b -> $defs.a"]),
    (NO_FINITE, ["no finite instance", "properties.x"]),
])
@pytest.mark.parametrize("stream", [False, True])
def test_unusable_schemas_are_refused_before_any_token(live, schema, words, stream):
    dev = live.srv.dev
    before = dev.counters.dispatches
    refused(post(live, {**schema_format(schema), "stream": stream}), "response_format", *words)
    assert dev.counters.dispatches == before            # no device work: refused up front


def test_tool_parameter_schemas_and_ollama_formats_are_checked_too(live):
    refused(post(live, {"tools": [tool(0, SELF_REF)]}), "tools", "tools[0].function.parameters")
    body = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}]}
    r = post(live, {"format": CYCLE}, "/api/chat", body)
    assert r.status_code == 400 and "no finite instance" in r.json()["error"], r.text


def test_grammar_engine_limits_and_errors_are_one_line_in_our_words(live, monkeypatch):
    monkeypatch.setitem(constrained.LIMITS, "max_grammar_size", 50)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(40)},
              "required": [f"p{i}" for i in range(40)]}
    refused(post(live, schema_format(schema)), "response_format",
            "too complex for this server's limits", "50")
    assert "NoExtensionBias" not in constrained.engine_error("x", "NoExtensionBias\n<state>...")


@pytest.mark.parametrize("extra,param", [
    ({"stream": "yes"}, "stream"), ({"max_tokens": "8"}, "max_tokens"), ({"n": 1.0}, "n"),
    ({"temperature": "0.5"}, "temperature"), ({"logprobs": 1}, "logprobs"),
    ({"stream_options": {"include_usage": "true"}, "stream": True}, "stream_options"),
])
def test_strict_types_openai(live, extra, param):
    err = refused(post(live, extra), param)
    assert err["code"] == "invalid_value"
    assert post(live, {"temperature": 1}).status_code == 200          # an integer is a number


def test_strict_types_completions_and_ollama(live):
    refused(post(live, {"stream": "yes"}, "/v1/completions", {"model": MODEL, "prompt": "hi"}),
            "stream")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for extra in ({"stream": "yes"}, {"options": {"num_predict": "8"}}):
        r = post(live, extra, "/api/chat", body)
        assert r.status_code == 400 and "invalid" in r.json()["error"], r.text


@pytest.mark.parametrize("tail", [b"\x03\x00\x00\x00" + b"\xff" * 60,          # huge counts
                                  b"\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
                                  b"\x01\x00\x00\x00\x00\x00\x00\x00" + b"\x05" * 8])
def test_hostile_gguf_refusals_are_in_our_words(tmp_path, tail):
    from torch_xdna.models.formats.gguf import open_gguf
    from torch_xdna.models.hf import ModelDirError
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGUF" + tail)
    with pytest.raises(ModelDirError) as e:
        open_gguf(p)
    msg = e.value.public_message
    assert "bad.gguf" in msg and "re-download" in msg, msg
    for raw in ("IndexError", "KeyError", "ValueError", "struct.error", "Error:", "out of bounds"):
        assert raw not in msg, msg
