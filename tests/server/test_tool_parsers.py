"""Tool-call and reasoning parsers on the output formats of each model family, whole and streamed character by
character (the stream must add up to the same calls and content)."""

import json

import pytest

from brisk.entrypoints.openai.reasoning_parsers import REASONING_PARSERS, ReasoningStream
from brisk.entrypoints.openai.tool_parsers import TOOL_PARSERS

CASES = {
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.",
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}; '
        '{"name": "get_time", "parameters": {}}',
        None,
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}, '
        '{"name": "get_time", "arguments": {}}]',
        None,
    ),  # fmt: skip
}
EXPECTED = [("get_weather", {"city": "Paris", "unit": "c"}), ("get_time", {})]


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_and_streamed_outputs_give_the_same_calls(name):
    text, content = CASES[name]
    whole = TOOL_PARSERS[name]().extract(text)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == EXPECTED
    parser, streamed, calls = TOOL_PARSERS[name](), "", []
    for end in range(1, len(text) + 1):
        delta = parser.stream(text[:end], finished=end == len(text))
        streamed += delta.content
        calls += delta.tool_calls
    assert streamed.strip() == (content or "")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_is_content(name):
    text = 'The weather is fine. {"name": is not a call} <tool_call'
    parser = TOOL_PARSERS[name]()
    assert parser.extract(text).tool_calls == [] and parser.extract(text).content == text
    streamed = "".join(parser.stream(text[:end], end == len(text)).content for end in range(1, len(text) + 1))
    assert streamed == text


def test_mistral_v11_named_calls():
    calls = TOOL_PARSERS["mistral"]().extract(
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'
    )
    assert [(c.name, json.loads(c.arguments)) for c in calls.tool_calls] == [("get_weather", {"city": "Paris"}),
                                                                             ("get_time", {})]  # fmt: skip


@pytest.mark.parametrize(
    "name, text, reasoning, content",
    [
        ("qwen3", "<think>\nLet me think.\n</think>\n\nParis.", "\nLet me think.\n", "Paris."),
        ("qwen3", "Paris.", None, "Paris."),
        ("deepseek_r1", "Let me think.</think>Paris.", "Let me think.", "Paris."),
        ("deepseek_r1", "<think>Let me think.</think>\nParis.", "Let me think.", "Paris."),
        ("deepseek_r1", "Still thinking", "Still thinking", None),
    ],
)
def test_reasoning_split_whole_and_streamed(name, text, reasoning, content):
    split = REASONING_PARSERS[name]().split(text)
    assert (split.reasoning, split.content) == (reasoning, content)
    stream, got_reasoning, got_content = ReasoningStream(REASONING_PARSERS[name]()), "", ""
    for end in range(1, len(text) + 1):
        r, c = stream.delta(text[:end], finished=end == len(text))
        got_reasoning, got_content = got_reasoning + r, got_content + c
    assert (got_reasoning or None, got_content or None) == (reasoning, content)


def test_hermes_reads_bare_json_calls():
    """Qwen2.5-Coder answers under the hermes template with the call's JSON alone, without the tags."""
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    whole = TOOL_PARSERS["hermes"]().extract(text)
    assert whole.content is None and [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    parser, calls, content = TOOL_PARSERS["hermes"](), [], ""
    for end in range(1, len(text) + 1):
        delta = parser.stream(text[:end], end == len(text))
        calls, content = calls + delta.tool_calls, content + delta.content
    assert content == "" and [c.name for c in calls] == ["get_weather"]
    assert TOOL_PARSERS["hermes"]().extract('{"a": 1}').content == '{"a": 1}'  # JSON that is no call is content
