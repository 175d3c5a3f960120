"""Structured outputs and the other logits constraints (logit bias, allowed tokens, bad words), offline.

A tiny random-weight model with a byte-level vocabulary says nothing sensible, so whatever it emits that parses
and validates is the grammar's doing: every sample must parse and validate, whatever the seed."""

import json

import jsonschema
import pytest

from brisk import LLM, SamplingParams
from brisk.structured_outputs import StructuredOutputsParams

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "ok": {"type": "boolean"}},
                "required": ["x", "ok"],
                "additionalProperties": False,
            },
            "kind": {"anyOf": [{"type": "null"}, {"enum": ["cat", "dog"]}]},
        },
        "required": ["point", "kind"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 1, "maxItems": 4},
]


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, device="cpu")


def _texts(llm, prompt, params):
    return [c for out in llm.generate([prompt], params, use_tqdm=False) for c in out.outputs]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["flat", "nested-anyof", "array"])
def test_json_schema_samples_validate(llm, schema):
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    params = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=200, structured_outputs=so)
    for completion in _texts(llm, "Data:", params):
        assert completion.finish_reason == "stop", completion.text
        # strict=False: xgrammar's JSON strings admit raw control characters, which a random model emits
        jsonschema.validate(json.loads(completion.text, strict=False), schema)


def test_json_object_regex_and_choice(llm):
    obj = SamplingParams(temperature=1.0, seed=3, max_tokens=200, structured_outputs={"json_object": True})
    assert isinstance(json.loads(_texts(llm, "Data:", obj)[0].text, strict=False), dict)
    regex = SamplingParams(
        n=3, temperature=1.0, seed=5, max_tokens=20, structured_outputs={"regex": r"[0-9]{3}-[a-z]{2}"}
    )
    for completion in _texts(llm, "Code:", regex):
        assert len(completion.text) == 6 and completion.text[3] == "-" and completion.text[:3].isdigit()
    choice = SamplingParams(
        n=4, temperature=1.0, seed=1, max_tokens=20, structured_outputs={"choice": ["yes", "no way"]}
    )
    assert {c.text for c in _texts(llm, "Answer:", choice)} <= {"yes", "no way"}


def test_grammar_is_the_same_with_async_scheduling(tiny_llama, llm):
    """Grammars need each token on the host before the next is sampled: async scheduling launches the next step
    once they are booked and gives the same tokens, stops and texts."""
    params = SamplingParams(
        n=2, temperature=1.0, seed=9, max_tokens=120,
        structured_outputs=StructuredOutputsParams(json=SCHEMAS[0], disable_any_whitespace=True),
    )  # fmt: skip
    plain = [c.token_ids for c in _texts(llm, "Data:", params)]
    async_llm = LLM(tiny_llama, device="cpu", async_scheduling=True)
    assert [c.token_ids for c in _texts(async_llm, "Data:", params)] == plain
    # A stop string inside the grammar's text ends it; under async scheduling it is found after the next step
    # (which needed this one's tokens for its bitmask) was launched, and that step's token is dropped.
    ends = SamplingParams(
        n=2, temperature=1.0, seed=2, max_tokens=20, stop=["way"], structured_outputs={"choice": ["no way"]}
    )
    outcomes = [
        [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in _texts(engine, "Answer:", ends)]
        for engine in (llm, async_llm)
    ]
    assert outcomes[0] == outcomes[1] and {o[1:] for o in outcomes[0]} == {("no ", "stop", "way")}
    engine = async_llm.engine
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks


def test_bad_constraints_are_errors_naming_the_field(llm):
    for so, field in [
        ({"json": {"type": "objectx"}}, "json"),
        ({"regex": "a("}, "regex"),
        ({"grammar": "root ::= "}, "grammar"),
        ({"choice": []}, "choice"),
        ({"regex": "a", "choice": ["b"]}, "exactly one"),
        ({"structural_tag": "{}"}, "structural_tag"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(structured_outputs=so)
    vocab = llm.engine.model_config.hf_config.vocab_size
    for kwargs in [{"logit_bias": {vocab: 1.0}}, {"allowed_token_ids": [0, vocab + 5]}]:
        with pytest.raises(ValueError, match="outside the vocabulary"):
            llm.generate(["x"], SamplingParams(**kwargs), use_tqdm=False)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={1: 101.0})


def test_logit_bias_allowed_tokens_and_bad_words(llm):
    tokenizer = llm.engine.tokenizer
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    base = _texts(llm, "The quick brown fox", greedy)[0]
    forced = tokenizer.encode("z", add_special_tokens=False)[0]
    biased = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logit_bias={str(forced): 100})
    assert _texts(llm, "The quick brown fox", biased)[0].token_ids == [forced] * 6
    allowed = [tokenizer.encode(c, add_special_tokens=False)[0] for c in "ab"]
    only = SamplingParams(temperature=1.0, seed=2, max_tokens=10, ignore_eos=True, allowed_token_ids=allowed)
    assert set(_texts(llm, "The quick brown fox", only)[0].token_ids) <= set(allowed)
    # Ban a word the unconstrained greedy run produces: it no longer appears, and the text up to it is the same.
    pieces = [tokenizer.decode(base.token_ids[i : i + 2]) for i in range(len(base.token_ids) - 1)]
    word = next(p.strip() for p in pieces if p.strip().isascii() and p.strip().isalpha() and len(p.strip()) > 1)
    banned = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, bad_words=[word])
    text = _texts(llm, "The quick brown fox", banned)[0].text
    assert word not in text and text != base.text
