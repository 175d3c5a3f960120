"""Structured outputs on the real models users run: 20 JSON schemas (nested objects, arrays, enums, bounded numbers,
``anyOf``, required fields), a regex and a choice, on SmolLM2-135M-Instruct and Qwen2.5-Coder-0.5B-Instruct.

A real model writes real values into the grammar's shape, so this checks what the tiny random model cannot: that
the constraint and the model's own preferences meet in outputs that parse and validate, end by themselves
(``finish_reason == "stop"``, not the token limit), and carry content. Every sample must validate; the schemas are
sent in one batch per model, as a server would see them. Skipped for a model whose packages are not installed
(CI installs both)."""

from __future__ import annotations

import json
import re

import jsonschema

from brisk import LLM, SamplingParams
from brisk.structured_outputs import StructuredOutputsParams
from tests.real_models import installed

SMOLLM2, smollm2_installed = installed("smollm2-135m-instruct")
QWEN, qwen_installed = installed("qwen2.5-coder-0.5b-instruct")


def _obj(properties: dict, required: list[str] | None = None) -> dict:
    """A closed object schema: every property required unless told otherwise."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


NAME = {"type": "string", "pattern": "^[A-Za-z ]{1,24}$"}
WORD = {"type": "string", "pattern": "^[A-Za-z]{1,16}$"}
SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 100}

# (what to ask for, the schema the answer must follow)
SCHEMAS: list[tuple[str, dict]] = [
    ("a person with a name and an age", _obj({"name": NAME, "age": SMALL_INT})),
    ("a city and its country", _obj({"city": NAME, "country": NAME})),
    ("a book with a title, a year and whether it is fiction",
     _obj({"title": NAME, "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
           "fiction": {"type": "boolean"}})),
    ("a traffic light colour", _obj({"colour": {"enum": ["red", "amber", "green"]}})),
    ("three primary colours", _obj({"colours": {"type": "array", "items": WORD, "minItems": 3, "maxItems": 3}})),
    ("a temperature in Celsius", _obj({"celsius": {"type": "number", "minimum": -90, "maximum": 60}})),
    ("a point with x and y coordinates",
     _obj({"point": _obj({"x": {"type": "integer", "minimum": -50, "maximum": 50},
                          "y": {"type": "integer", "minimum": -50, "maximum": 50}})})),
    ("a user with an optional nickname", _obj({"user": NAME, "nickname": WORD}, required=["user"])),
    ("a product with a price and a currency",
     _obj({"product": NAME, "price": {"type": "number", "minimum": 0, "maximum": 10000},
           "currency": {"enum": ["USD", "EUR", "GBP"]}})),
    ("a shopping list of up to four fruits",
     _obj({"items": {"type": "array", "items": WORD, "minItems": 1, "maxItems": 4}})),
    ("a pet that is a cat, a dog or nothing", _obj({"pet": {"anyOf": [{"type": "null"}, {"enum": ["cat", "dog"]}]}})),
    ("a rating from one to five stars and a short verdict",
     _obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}, "verdict": NAME})),
    ("a team with a name and two members, each with a name and a role",
     _obj({"team": NAME, "members": {"type": "array", "minItems": 2, "maxItems": 2,
                                     "items": _obj({"name": NAME, "role": {"enum": ["lead", "dev", "qa"]}})}})),
    ("an answer that is either a number or a word",
     _obj({"answer": {"anyOf": [SMALL_INT, WORD]}})),
    ("a date as year, month and day",
     _obj({"year": {"type": "integer", "minimum": 1900, "maximum": 2100},
           "month": {"type": "integer", "minimum": 1, "maximum": 12},
           "day": {"type": "integer", "minimum": 1, "maximum": 31}})),
    ("a list of two or three even numbers below ten",
     {"type": "array", "items": {"enum": [0, 2, 4, 6, 8]}, "minItems": 2, "maxItems": 3}),
    ("an HTTP status code and its reason",
     _obj({"code": {"type": "integer", "minimum": 100, "maximum": 599}, "reason": NAME})),
    ("a planet and whether it has rings", _obj({"planet": WORD, "rings": {"type": "boolean"}})),
    ("a recipe with a name and up to three ingredients, each with a name and a quantity in grams",
     _obj({"recipe": NAME, "ingredients": {"type": "array", "minItems": 1, "maxItems": 3,
                                            "items": _obj({"name": WORD, "grams": SMALL_INT})}})),
    ("a weekday", {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]}),
]  # fmt: skip
assert len(SCHEMAS) == 20

DATE = r"\d{4}-\d{2}-\d{2}"
CHOICES = ["positive", "negative", "neutral"]
MAX_TOKENS = 200


def _chat(llm: LLM, questions: list[str], params: list[SamplingParams]):
    conversations = [[{"role": "user", "content": q}] for q in questions]
    return [out.outputs[0] for out in llm.chat(conversations, params, use_tqdm=False)]


def _check_model(model: str) -> None:
    llm = LLM(model, device="cpu", kv_cache_memory_bytes=256 << 20, max_model_len=1024)
    questions = [f"Reply in JSON: {what}." for what, _ in SCHEMAS]
    questions += [
        "On which date did the first person walk on the Moon? Reply with the date only, as YYYY-MM-DD.",
        "Is this review positive, negative or neutral? 'The food was wonderful and the staff were kind.'",
    ]
    so = [StructuredOutputsParams(json=schema) for _, schema in SCHEMAS]
    so += [StructuredOutputsParams(regex=DATE), StructuredOutputsParams(choice=CHOICES)]
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, structured_outputs=s) for s in so]
    outputs = _chat(llm, questions, params)
    for (what, schema), out in zip(SCHEMAS, outputs):
        assert out.finish_reason == "stop", f"{what}: ran to the token limit: {out.text!r}"
        jsonschema.validate(json.loads(out.text), schema)
    date, choice = outputs[len(SCHEMAS)], outputs[len(SCHEMAS) + 1]
    assert re.fullmatch(DATE, date.text), date.text
    assert choice.text in CHOICES


@smollm2_installed
def test_smollm2_follows_20_schemas_a_regex_and_a_choice():
    _check_model(SMOLLM2.name)


@qwen_installed
def test_qwen_follows_20_schemas_a_regex_and_a_choice():
    _check_model(QWEN.name)
