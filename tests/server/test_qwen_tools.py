"""A weather-style tool round trip with the real Qwen2.5-Coder-0.5B-Instruct, the hermes parser and the unmodified
openai client, streamed and not. Skipped unless the model's part packages are installed (CI installs them)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.real_models import installed
from tests.server.conftest import MODEL_NAME, ServerProcess

QWEN, skip_unless_installed = installed("qwen2.5-coder-0.5b-instruct")
pytestmark = skip_unless_installed

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name"}},
                "required": ["city"],
            },
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client():
    server = ServerProcess(
        QWEN.name, "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-model-len", "1024",
        "--kv-cache-memory-bytes", "64MiB", startup_timeout=600,
    )  # fmt: skip
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=300)
    server.stop()


def test_tool_round_trip(client):
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=60
    )
    choice = reply.choices[0]
    [call] = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    conversation = QUESTION + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees Celsius."},
    ]
    # The tool's result goes back through the template; this small coder model then tends to call again, so the
    # answer is asked for as text (tool_choice "none") and only its shape is checked.
    answer = client.chat.completions.create(
        model=MODEL_NAME, messages=conversation, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=20
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens + 10  # the call and its result were rendered


def test_streamed_tool_call(client):
    calls = []
    for chunk in client.chat.completions.create(
        model=MODEL_NAME, messages=QUESTION, tools=TOOLS, temperature=0, max_tokens=60, stream=True
    ):
        calls += chunk.choices[0].delta.tool_calls or [] if chunk.choices else []
    [call] = calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}


FLIGHT_TOOL = {
    "type": "function",
    "function": {
        "name": "book_flight",
        "description": "Book a flight",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                "cabin": {"enum": ["economy", "business"]},
            },
            "required": ["origin", "destination", "passengers", "cabin"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_named_tool_choice_always_gives_valid_arguments(client, stream):
    """Forced to the flight tool, even for requests that are not about flights, sampled at temperature 1: the
    arguments always parse and follow the schema (structured outputs write them)."""
    import jsonschema

    schema = FLIGHT_TOOL["function"]["parameters"]
    for seed, question in enumerate(["Two of us fly from Oslo to Rome in business.", "What is 2 + 2?", "Hello!"]):
        reply = client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": question}], tools=[FLIGHT_TOOL, *TOOLS],
            tool_choice={"type": "function", "function": {"name": "book_flight"}}, temperature=1.0, seed=seed,
            max_tokens=120, stream=stream,
        )  # fmt: skip
        if stream:
            calls = [c for chunk in reply if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
        else:
            calls = reply.choices[0].message.tool_calls
        [call] = calls
        assert call.function.name == "book_flight"
        jsonschema.validate(json.loads(call.function.arguments), schema)
