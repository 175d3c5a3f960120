"""Structured outputs, tools, reasoning and vLLM's request extensions through a real ``brisk serve`` and the
unmodified ``openai`` client. The tiny model is random: what it emits holds its shape only because the grammar
forces it (so a parse that succeeds is the feature working), and formats a trained model would write (hermes tool
calls, <think> reasoning) are forced with a regex to exercise the parsers end to end."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import MODEL_NAME, ServerProcess

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
HERMES_CALL = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[a-z]{1,6}", "unit": "c"\}\}\n</tool_call>'
)
USER = [{"role": "user", "content": "Weather in Paris?"}]


class Person(BaseModel):
    name: str = Field(pattern="^[a-z]{1,8}$")
    age: int = Field(ge=0, le=120)
    pet: Literal["cat", "dog"] | None
    happy: bool


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def parser_server(tiny_model_dir):
    proc = ServerProcess(
        tiny_model_dir, "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"
    )
    yield openai.OpenAI(base_url=f"{proc.url}/v1", api_key=proc.api_key, max_retries=0, timeout=120)
    proc.stop()


def test_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(
        model=MODEL_NAME, messages=USER, response_format=Person, max_completion_tokens=400, temperature=1.0, seed=4
    )
    person = completion.choices[0].message.parsed
    assert isinstance(person, Person) and completion.choices[0].finish_reason == "stop"


def test_json_object_choice_regex_and_bad_constraints(client):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, response_format={"type": "json_object"}, max_tokens=150, temperature=0.7,
        seed=1, extra_body={"structured_outputs": None},
    )  # fmt: skip
    assert isinstance(json.loads(reply.choices[0].message.content, strict=False), dict)
    done = client.completions.create(
        model=MODEL_NAME, prompt="Answer:", max_tokens=10, n=3, temperature=1.0, seed=2,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )  # fmt: skip
    assert {c.text for c in done.choices} <= {"yes", "no"}
    done = client.completions.create(
        model=MODEL_NAME, prompt="Code:", max_tokens=10, extra_body={"structured_outputs": {"regex": "[0-9]{4}"}}
    )
    assert done.choices[0].text.isdigit() and len(done.choices[0].text) == 4
    for extra, field in [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
         "response_format"),
        ({"structured_outputs": {"regex": "a("}}, "structured_outputs"),
        ({"structured_outputs": {"jsonn": {}}}, "structured_outputs"),
        ({"store": True}, "store"),
        ({"priority": 3}, "priority"),
    ]:  # fmt: skip
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=4, extra_body=extra)
        assert e.value.body["param"] == field, e.value.body


def test_fields_that_ask_for_nothing_are_accepted(client):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=USER, max_tokens=4, tools=[WEATHER_TOOL], tool_choice="none", logit_bias={},
        store=False, metadata={"k": "v"}, service_tier="auto", parallel_tool_calls=True, user="u1",
    )  # fmt: skip
    assert reply.choices[0].message.tool_calls in (None, [])


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_tool_choice_give_valid_calls(client, stream):
    def calls_of(**kwargs):
        if not stream:
            reply = client.chat.completions.create(model=MODEL_NAME, messages=USER, max_tokens=400, **kwargs)
            assert reply.choices[0].finish_reason == "tool_calls"
            return [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls]
        calls, reason = {}, None
        for chunk in client.chat.completions.create(
            model=MODEL_NAME, messages=USER, max_tokens=400, stream=True, **kwargs
        ):
            for delta_call in chunk.choices[0].delta.tool_calls or []:
                call = calls.setdefault(delta_call.index, {"name": "", "arguments": ""})
                call["name"] += delta_call.function.name or ""
                call["arguments"] += delta_call.function.arguments or ""
            reason = chunk.choices[0].finish_reason or reason
        assert reason == "tool_calls"
        return [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]

    tools = [WEATHER_TOOL, TIME_TOOL]
    # one call (parallel_tool_calls false): a random model would otherwise add calls until max_tokens
    for name, args in calls_of(tools=tools, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=7):
        assert name in ("get_weather", "get_time")
        if name == "get_weather":
            assert args["unit"] in ("c", "f") and args["city"].isalpha()
    named = {"type": "function", "function": {"name": "get_weather"}}
    [(name, args)] = calls_of(tools=tools, tool_choice=named, temperature=1.0, seed=8)
    assert name == "get_weather" and set(args) == {"city", "unit"}


def test_tool_round_trip_and_auto_needs_the_flags(client):
    conversation = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    reply = client.chat.completions.create(model=MODEL_NAME, messages=conversation, tools=[WEATHER_TOOL], max_tokens=5,
                                           tool_choice="none")  # fmt: skip
    assert reply.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
        client.chat.completions.create(model=MODEL_NAME, messages=USER, tools=[WEATHER_TOOL], max_tokens=5)


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_calls_and_reasoning_are_parsed(parser_server, stream):
    """Hermes-format calls after <think> reasoning, as Qwen3 writes them (forced by a regex here)."""
    regex = r"<think>[a-z]{1,8}</think>\n" + HERMES_CALL
    kwargs = dict(model=MODEL_NAME, messages=USER, tools=[WEATHER_TOOL], max_tokens=120, temperature=1.0, seed=3,
                  extra_body={"structured_outputs": {"regex": regex}})  # fmt: skip
    if not stream:
        message = parser_server.chat.completions.create(**kwargs).choices[0].message
        reasoning, calls = message.reasoning_content, message.tool_calls
        names_args = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    else:
        reasoning, names_args = "", []
        for chunk in parser_server.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            names_args += [(c.function.name, json.loads(c.function.arguments)) for c in delta.tool_calls or []]
    assert reasoning and reasoning.isalpha()
    [(name, args)] = names_args
    assert name == "get_weather" and args["unit"] == "c"


def test_vllm_extensions(client, server):
    stream = client.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=6, stream=True, temperature=0,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    counts = [c.usage.completion_tokens for c in chunks if c.choices]
    assert counts == sorted(counts) and counts[-1] == 6 and all(c.usage is not None for c in chunks)
    base = client.completions.create(model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8, temperature=0,
                                     extra_body={"ignore_eos": True})  # fmt: skip
    text = base.choices[0].text
    stop = text[3:5]
    kept = client.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=8, temperature=0, stop=[stop],
        extra_body={"ignore_eos": True, "include_stop_str_in_output": True},
    )  # fmt: skip
    assert kept.choices[0].text.endswith(stop) and text.startswith(kept.choices[0].text)
    ids = client.completions.create(
        model=MODEL_NAME, prompt="The quick brown fox", max_tokens=3, temperature=0, logprobs=1,
        extra_body={"return_tokens_as_token_ids": True, "request_id": "abc123", "truncate_prompt_tokens": 2,
                    "logit_bias": {"65": 100}, "add_special_tokens": False},
    )  # fmt: skip
    assert ids.id == "cmpl-abc123" and ids.usage.prompt_tokens == 2
    assert ids.choices[0].logprobs.tokens == ["token_id:65"] * 3


@pytest.mark.parametrize("stream", [False, True])
def test_include_reasoning_false_drops_the_reasoning(parser_server, stream):
    """vLLM's include_reasoning: false: no reasoning_content (messages or deltas); the content is the same."""
    regex = r"<think>[a-z]{1,8}</think>\n[a-z]{1,8}"
    kwargs = dict(model=MODEL_NAME, messages=USER, max_tokens=40, temperature=1.0, seed=5)

    def reply(include: bool) -> tuple[str, str]:
        extra_body = {"structured_outputs": {"regex": regex}, "include_reasoning": include}
        if not stream:
            message = parser_server.chat.completions.create(extra_body=extra_body, **kwargs).choices[0].message
            return message.reasoning_content or "", message.content or ""
        reasoning = content = ""
        for chunk in parser_server.chat.completions.create(stream=True, extra_body=extra_body, **kwargs):
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
        return reasoning, content

    with_reasoning, content = reply(True)
    assert with_reasoning.isalpha() and content.isalpha()
    assert reply(False) == ("", content)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_api_reasoning_and_function_call_items(parser_server, stream):
    """The Responses API over the same parsers: a reasoning item, then a function_call item per call (its
    ``call_id`` what a function_call_output answers), streamed as their items' events."""
    regex = r"<think>[a-z]{1,8}</think>\n" + HERMES_CALL
    tools = [{"type": "function", **WEATHER_TOOL["function"]}]
    kwargs = dict(model=MODEL_NAME, input="Weather in Paris?", tools=tools, max_output_tokens=120, temperature=1.0,
                  extra_body={"seed": 3, "structured_outputs": {"regex": regex}})  # fmt: skip
    if stream:
        with parser_server.responses.stream(**kwargs) as events:
            kinds = [event.type for event in events]
            response = events.get_final_response()
        assert {"response.reasoning_text.delta", "response.function_call_arguments.done"} <= set(kinds), kinds
    else:
        response = parser_server.responses.create(**kwargs)
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text.isalpha()
    assert call.type == "function_call" and call.name == "get_weather" and json.loads(call.arguments)["unit"] == "c"
    assert call.call_id.startswith("call_") and response.status == "completed"
