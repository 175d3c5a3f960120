"""langchain-openai, unmodified, against ``brisk serve``: structured output from a Pydantic model, and tools bound
to a chat model through a whole round trip (the call, the tool's result, the answer)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import MODEL_NAME

langchain_openai = pytest.importorskip("langchain_openai")


class City(BaseModel):
    """A city and its country code."""

    name: str = Field(pattern="^[a-z]{1,8}$")
    country: str = Field(pattern="^[A-Z]{2}$")


class GetWeather(BaseModel):
    """The weather in a city (arguments bounded, so that a random model completes them)."""

    city: str = Field(pattern="^[a-z]{1,8}$")


@pytest.fixture(scope="module")
def chat(server):
    return langchain_openai.ChatOpenAI(
        model=MODEL_NAME, base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=120,
        temperature=1.0, seed=5, max_tokens=300,
    )  # fmt: skip


def test_with_structured_output(chat):
    city = chat.with_structured_output(City).invoke("Name a city.")
    assert isinstance(city, City)


def tool_round_trip(chat, answering_chat) -> None:
    """The call (forced by a named tool choice), the tool's result, then the answer (no tools chosen)."""
    from langchain_core.messages import HumanMessage, ToolMessage

    with_tools = chat.bind_tools([GetWeather], tool_choice="GetWeather")
    messages = [HumanMessage("What is the weather in Paris?")]
    reply = with_tools.invoke(messages)
    [call] = reply.tool_calls
    assert call["name"] == "GetWeather" and set(call["args"]) == {"city"}
    messages += [reply, ToolMessage(f"sunny in {call['args']['city']}", tool_call_id=call["id"])]
    answer = answering_chat.bind_tools([GetWeather], tool_choice="none").invoke(messages)
    assert isinstance(answer.text, str) and not answer.tool_calls


def test_bind_tools_round_trip(chat):
    tool_round_trip(chat, chat)


def responses_model(server, max_tokens: int):
    """The same chat model over OpenAI's Responses API (``/v1/responses``)."""
    return langchain_openai.ChatOpenAI(
        model=MODEL_NAME, base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=120,
        temperature=1.0, max_tokens=max_tokens, use_responses_api=True, extra_body={"seed": 5},
    )  # fmt: skip


def test_responses_api_text_stream_structured_output_and_tools(server):
    """What langchain sends over the Responses API: a reply, a stream of it, structured output, and a tool round
    trip (the call's item, then the tool's result as a function_call_output)."""
    short, responses_chat = responses_model(server, 6), responses_model(server, 300)
    reply = short.invoke("Hello")
    assert isinstance(reply.text, str) and reply.text and reply.usage_metadata["output_tokens"] <= 6
    streamed = "".join(chunk.text for chunk in short.stream("Hello"))
    assert streamed
    city = responses_chat.with_structured_output(City).invoke("Name a city.")
    assert isinstance(city, City)
    tool_round_trip(responses_chat, short)
