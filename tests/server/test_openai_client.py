"""The official ``openai`` client against ``brisk serve``: completions, chat, streaming, n, stop, logprobs."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL_NAME

PROMPT = "The quick brown fox"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Paris is the capital of"},
]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=60)


def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME


def test_completion_greedy_and_usage(client):
    r = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.created > 0
    assert r.model == MODEL_NAME
    (choice,) = r.choices
    assert choice.finish_reason == "length" and choice.index == 0
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    again = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert again.choices[0].text == choice.text  # greedy is deterministic


def test_completion_stream_equals_non_stream(client):
    kwargs = dict(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_and_chat_stream(client):
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=16, temperature=0, seed=1)
    full = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    msg = full.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert full.usage.completion_tokens == 16 and full.choices[0].finish_reason == "length"

    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert (
        chunks[-1].usage.completion_tokens == 16
        and chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    )


def test_chat_text_parts_and_developer_role(client):
    parts = [{"type": "text", "text": "Paris is "}, {"type": "text", "text": "the capital of"}]
    r = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "developer", "content": "You are terse."}, {"role": "user", "content": parts}],
        max_tokens=4,
        temperature=0,
    )
    assert r.choices[0].message.content is not None


def test_n_2(client):
    r = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=8,
        n=2,
        temperature=1.0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 16
    assert r.choices[0].text != r.choices[1].text  # different seeds per choice
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=6, n=2, stream=True, temperature=1.0, seed=3
    )
    texts = {0: "", 1: ""}
    finished = set()
    for c in chat:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finished.add(ch.index)
    assert finished == {0, 1}


def test_multiple_prompts_and_token_prompts(client, server):
    ids = server.client().post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    r = client.completions.create(
        model=MODEL_NAME,
        prompt=[PROMPT, "Hello"],
        max_tokens=5,
        temperature=0,
        n=2,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 20
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=5, temperature=0)
    by_text = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model=MODEL_NAME, prompt=[ids, ids[:2]], max_tokens=3, temperature=0)
    assert len(batch.choices) == 2


def test_stop_string(client):
    base = (
        client.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    # Stop on a piece of the greedy text: the output is what came before it, and the stop string is not in it.
    stop = next((base[i : i + 2] for i in range(3, len(base) - 2) if base[i : i + 2].strip()), None)
    assert stop is not None, base
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == base[: base.index(stop)]
    assert stop not in choice.text
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0, stop=stop, stream=True
        )
    )
    assert streamed == choice.text


def test_completion_logprobs_and_echo(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and 1 <= len(top) <= 4
        assert max(top.values()) >= chosen - 1e-4  # greedy: the chosen token is the most likely one
    echo = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True
    )
    choice = echo.choices[0]
    assert choice.text.startswith(PROMPT)
    assert choice.logprobs.token_logprobs[0] is None  # the first prompt token has no logprob
    assert choice.logprobs.text_offset[0] == 0
    n_prompt = echo.usage.prompt_tokens
    assert len(choice.logprobs.tokens) == n_prompt + 2


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True, stream=True
    )
    streamed = [
        t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=10, temperature=1.0, top_p=0.9, seed=1234)
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b


def test_extras_and_penalties(client):
    r = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=6,
        temperature=0.8,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        user="someone",
        extra_body={
            "top_k": 5,
            "min_p": 0.05,
            "repetition_penalty": 1.2,
            "min_tokens": 6,
            "ignore_eos": True,
        },
    )
    assert r.usage.completion_tokens == 6


def test_vllm_extension_fields_through_extra_body(client):
    """vLLM 0.26's request extensions as its users send them, in the client's ``extra_body``: the reply carries the
    token ids (``return_token_ids``, read back through the client's untyped extra fields), those of a greedy
    reply without the extensions, and a refused value is the client's BadRequestError naming the field."""
    kwargs = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=8, temperature=0)
    plain = client.chat.completions.create(**kwargs, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(
        **kwargs,
        extra_body={"ignore_eos": True, "return_token_ids": True, "include_reasoning": True,
                    "truncation_side": None, "vllm_xargs": {}, "kv_transfer_params": None},
    )  # fmt: skip
    (choice,) = r.choices
    assert choice.message.content == plain.choices[0].message.content
    assert len(choice.model_extra["token_ids"]) == r.usage.completion_tokens == 8
    assert len(r.model_extra["prompt_token_ids"]) == r.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="use_beam_search"):
        client.chat.completions.create(**kwargs, extra_body={"use_beam_search": True})


def test_tokenize_detokenize(server):
    with server.client() as c:
        tok = c.post("/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}).json()
        assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 512
        assert c.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] == PROMPT
        chat = c.post("/tokenize", json={"messages": MESSAGES}).json()
        assert chat["count"] > tok["count"]


def test_openapi_document(server):
    with server.client() as c:
        doc = c.get("/openapi.json").json()
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/health",
    ):
        assert path in doc["paths"]


def test_unknown_model_is_not_found(client):
    """The openai client raises NotFoundError for a 404, as it does against OpenAI and vLLM."""
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
    assert "gpt-4" in info.value.message and MODEL_NAME in info.value.message
