"""OpenAI's Responses API (``/v1/responses``) through a real ``brisk serve`` and the unmodified ``openai`` client:
the reply is the chat endpoint's for the same conversation (greedy), streamed as the events the client's stream
helper checks, with structured outputs, logprobs and clear errors for what brisk keeps none of. Function calls and
reasoning items: tests/server/test_structured_and_tools.py."""

from __future__ import annotations

import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import MODEL_NAME

GREEDY = {"model": MODEL_NAME, "temperature": 0, "max_output_tokens": 8, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=60)


def chat_reply(client, messages: list[dict], extra_body: dict | None = None, **kwargs):
    return client.chat.completions.create(
        model=MODEL_NAME, messages=messages, temperature=0, max_tokens=8,
        extra_body={"ignore_eos": True, **(extra_body or {})}, **kwargs,
    )  # fmt: skip


def collapsed(kinds: list[str]) -> list[str]:
    return [kind for i, kind in enumerate(kinds) if i == 0 or kinds[i - 1] != kind]


def test_text_reply_is_the_chat_reply(client):
    """``instructions`` are the system message before the input; the reply ran into ``max_output_tokens``, so the
    response is incomplete, with vLLM's usage fields."""
    response = client.responses.create(input="Hello there", instructions="Be brief.", **GREEDY)
    chat = chat_reply(client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}])
    assert response.output_text == chat.choices[0].message.content
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.id.startswith("msg_") and message.status == "completed"
    assert response.usage.input_tokens == chat.usage.prompt_tokens and response.usage.output_tokens == 8
    assert response.usage.total_tokens == response.usage.input_tokens + 8
    assert response.max_output_tokens == 8 and response.temperature == 0 and response.store is False


def test_stream_sends_the_events_the_client_checks(client):
    """The stream helper of the openai client accepts the events (it raises on an item's content before the item,
    changed ids, or no ``response.completed``) and rebuilds the non-streamed response's text."""
    whole = client.responses.create(input="Hello there", **GREEDY)
    with client.responses.stream(input="Hello there", **GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1 and kinds == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * deltas, "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output_text == whole.output_text == "".join(e.delta for e in events if hasattr(e, "delta"))
    assert final.id == events[0].response.id and final.output[0].id == events[2].item.id
    assert final.usage.output_tokens == 8 and final.status == "incomplete"
    raw = [e.type for e in client.responses.create(input="Hello there", stream=True, **GREEDY)]
    assert collapsed(raw) == collapsed(kinds)  # a delta carries what is new: one token or several


def test_input_items_are_the_chat_conversation(client):
    """Message items (typed or OpenAI's shorthand, text or content parts), a previous response's assistant message,
    its function call and the call's output: the same conversation, and reply, as the chat messages."""
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
    items = [
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ]  # fmt: skip
    response = client.responses.create(input=items, tools=[tool], tool_choice="none", **GREEDY)
    parts = [{"type": "input_text", "text": "sunny, "}, {"type": "input_text", "text": "21 C"}]
    as_parts = client.responses.create(input=[*items[:-1], {**items[-1], "output": parts}], tools=[tool],
                                       tool_choice="none", **GREEDY)  # fmt: skip
    assert as_parts.output_text == response.output_text
    messages = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    chat = chat_reply(client, messages)  # tool_choice "none": the prompt shows no tools, as vLLM's
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_an_unfinished_assistant_message_is_continued(client):
    """A last assistant message whose status is ``incomplete`` (a reply cut short) goes on, as chat's
    ``continue_final_message``; a finished one starts a new turn."""
    cut = {"type": "message", "role": "assistant", "content": "The answer is", "status": "incomplete"}
    response = client.responses.create(input=[{"role": "user", "content": "hi"}, cut], **GREEDY)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]
    chat = chat_reply(client, messages, extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    done = client.responses.create(input=[{"role": "user", "content": "hi"}, {**cut, "status": "completed"}], **GREEDY)
    assert done.usage.input_tokens > response.usage.input_tokens


def test_truncation_auto_leaves_room_for_the_reply(client, server):
    """``truncation: "auto"`` keeps the input's last tokens, as many as fit beside ``max_output_tokens``."""
    long_input = "pack my box with five dozen liquor jugs " * 60
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.responses.create(model=MODEL_NAME, input=long_input, max_output_tokens=8)
    response = client.responses.create(input=long_input, truncation="auto", **GREEDY)
    max_model_len = client.models.list().data[0].max_model_len
    assert response.usage.input_tokens == max_model_len - 8 and response.usage.output_tokens == 8


class City(BaseModel):
    name: str = Field(pattern="^[a-z]{1,8}$")
    population: int = Field(ge=0, le=1000)


def test_text_format_is_structured_output(client):
    """``text.format`` json_schema constrains the reply, so the client's ``responses.parse`` gets its object."""
    parsed = client.responses.parse(model=MODEL_NAME, input="A city?", text_format=City, max_output_tokens=400,
                                    temperature=1.0, extra_body={"seed": 4})  # fmt: skip
    assert isinstance(parsed.output_parsed, City) and parsed.status == "completed"
    raw = client.responses.create(model=MODEL_NAME, input="A city?", max_output_tokens=30, temperature=0.7,
                                  text={"format": {"type": "json_object"}}, extra_body={"seed": 2})  # fmt: skip
    chat = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "A city?"}],
                                          max_tokens=30, temperature=0.7, seed=2,
                                          response_format={"type": "json_object"})  # fmt: skip
    assert raw.output_text == chat.choices[0].message.content and raw.output_text.lstrip().startswith("{")


def test_logprobs_are_included_when_asked(client):
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs``: the chat endpoint's logprobs of the
    same tokens, on the text part (and on the stream's deltas)."""
    response = client.responses.create(input="Hello there", include=["message.output_text.logprobs"],
                                       top_logprobs=2, **GREEDY)  # fmt: skip
    chat = chat_reply(client, [{"role": "user", "content": "Hello there"}], logprobs=True, top_logprobs=2)
    got = response.output[0].content[0].logprobs
    want = chat.choices[0].logprobs.content
    assert [t.token for t in got] == [t.token for t in want] and len(got) == 8
    assert [t.logprob for t in got] == pytest.approx([t.logprob for t in want], abs=1e-4)
    assert all(len(t.top_logprobs) == 2 for t in got)
    events = list(client.responses.create(input="Hello there", include=["message.output_text.logprobs"],
                                          top_logprobs=2, stream=True, **GREEDY))  # fmt: skip
    streamed = [t for e in events if e.type == "response.output_text.delta" for t in e.logprobs]
    assert [t.token for t in streamed] == [t.token for t in got]
    assert client.responses.create(input="Hello there", **GREEDY).output[0].content[0].logprobs == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"include": ["message.output_text.everything"]}, "include"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"input": []}, "input"),
    ],
)
def test_what_brisk_lacks_is_a_400_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**{"model": MODEL_NAME, "input": "Hi", **fields})
    assert param in str(info.value.body.get("param") or info.value.message), info.value.body


def test_no_response_is_kept(client):
    """brisk keeps no responses, as vLLM keeps none unless told to: retrieving or cancelling one is a 404."""
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_123")
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_123")
