"""Engine-level sampling features: grammar-constrained output (llguidance), log-probabilities
against the HF reference, presence/frequency penalties, logit_bias, n > 1 after one prefill."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from llm_fixtures import build_model, hf_logits
from torch_xdna.engine.llm.constrained import Grammar, GrammarError
from torch_xdna.engine.llm.generate import GenerationConfig, load_decoder
from torch_xdna.engine.llm.logits import LogitBias, Penalties

PROMPT = "the quick brown fox"
SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 6},
                         "days": {"type": "integer", "minimum": 1, "maximum": 9},
                         "unit": {"enum": ["c", "f"]}},
          "required": ["city", "days", "unit"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-c")
    model = build_model("qwen3", path, seed=3)
    eng = load_decoder(path, "fp32", max_context=96, quiet=True)
    yield eng, model
    eng.close()


def _run(eng, prompt, cfg):
    out: dict[int, dict] = {}
    for c in eng.generate(prompt, cfg):
        o = out.setdefault(c.index, {"text": "", "ids": [], "lp": [], "finish": None})
        o["text"] += c.text
        o["ids"] += c.token_ids
        o["lp"] += c.logprobs or []
        o["finish"] = c.finish_reason or o["finish"]
    return out


def test_json_schema_output_parses_and_validates(tiny):
    eng, _ = tiny
    for temperature, seed in ((0.0, None), (1.0, 1)):
        cfg = GenerationConfig(max_tokens=50, temperature=temperature, seed=seed,
                               grammar=Grammar("json_schema", SCHEMA))
        o = _run(eng, PROMPT, cfg)[0]
        assert o["finish"] == "stop", o
        jsonschema.validate(json.loads(o["text"]), SCHEMA)
    # any JSON object: a random model may ramble to the token limit (cut JSON, finish "length");
    # the outputs that end are objects
    done = [o for o in (_run(eng, PROMPT, GenerationConfig(
        max_tokens=40, temperature=1.0, seed=s, grammar=Grammar("json_object")))[0]
        for s in (1,)) if o["finish"] == "stop"]
    assert done and all(isinstance(json.loads(o["text"]), dict) for o in done)


def test_invalid_schema_is_a_grammar_error(tiny):
    eng, _ = tiny
    with pytest.raises(GrammarError):
        list(eng.generate(PROMPT, GenerationConfig(grammar=Grammar("json_schema",
                                                                   {"type": "nonsense"}))))


def test_logprobs_match_the_hf_reference(tiny):
    eng, model = tiny
    ids = eng.encode_prompt(PROMPT)
    o = _run(eng, ids, GenerationConfig(max_tokens=5, logprobs=3, stop_token_ids=()))[0]
    assert len(o["lp"]) == len(o["ids"]) == 5
    ref = torch.log_softmax(hf_logits(model, ids + o["ids"]), -1)[len(ids) - 1:-1]
    for k, (tok, lp) in enumerate(zip(o["ids"], o["lp"])):
        assert lp.token == tok
        assert abs(lp.logprob - float(ref[k, tok])) < 2e-3
        top_ids = [i for i, _ in lp.top]
        assert top_ids == torch.topk(ref[k], 3).indices.tolist()    # greedy: top-1 is the pick
        assert top_ids[0] == tok


def test_n_samples_share_one_prefill(tiny):
    eng, _ = tiny
    dev = eng.decoder.dev
    cfg = GenerationConfig(max_tokens=6, temperature=1.0, seed=11, n=3, stop_token_ids=())
    d0 = dev.counters.dispatches
    out = _run(eng, PROMPT, cfg)
    d_n3 = dev.counters.dispatches - d0
    assert sorted(out) == [0, 1, 2] and all(len(o["ids"]) == 6 for o in out.values())
    assert len({tuple(o["ids"]) for o in out.values()}) > 1          # distinct samples
    # sample i equals a single generation seeded like it (same prompt KV, same RNG stream)
    one = _run(eng, PROMPT, GenerationConfig(max_tokens=6, temperature=1.0, seed=11,
                                             stop_token_ids=()))[0]
    assert one["ids"] == out[0]["ids"]

    def dispatches(max_tokens: int) -> int:
        d0 = dev.counters.dispatches
        _run(eng, PROMPT, GenerationConfig(max_tokens=max_tokens, stop_token_ids=()))
        return dev.counters.dispatches - d0
    prefill = dispatches(1)                                     # 1 token: the prefill only
    step = (dispatches(6) - prefill) // 5                       # 5 decode forwards
    assert d_n3 == prefill + 3 * 5 * step                       # the prompt ran once for 3


def test_penalties_and_logit_bias():
    logits = torch.zeros(6)
    p = Penalties(presence=0.5, frequency=0.25)
    for t in (1, 1, 3):
        p.accept(t)
    torch.testing.assert_close(p(logits.clone()), torch.tensor([0, -1.0, 0, -0.75, 0, 0]))
    b = LogitBias({2: 5.0, 4: -100}, vocab=6)
    torch.testing.assert_close(b(logits.clone()), torch.tensor([0, 0, 5.0, 0, -100, 0]))
    with pytest.raises(ValueError, match="token id 9"):
        LogitBias({9: 1.0}, vocab=6)


def test_engine_penalties_and_bias_steer_greedy_decoding(tiny):
    eng, _ = tiny
    o = _run(eng, PROMPT, GenerationConfig(max_tokens=12, presence_penalty=50.0,
                                           stop_token_ids=()))[0]
    assert len(set(o["ids"])) == len(o["ids"])          # a huge presence penalty: no repeats
    o = _run(eng, PROMPT, GenerationConfig(max_tokens=4, logit_bias=((77, 100.0),),
                                           stop_token_ids=()))[0]
    assert o["ids"] == [77] * 4
