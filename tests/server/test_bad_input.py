"""Malformed requests get a 4xx with an OpenAI-style error body naming the problem; the server lives on."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import MODEL_NAME

C = "/v1/completions"
CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "The quick brown fox jumps over the lazy dog. " * 80  # far more than 512 tokens


def comp(**fields):
    return {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, **fields}


def chat(**fields):
    return {"model": MODEL_NAME, "messages": MSG, "max_tokens": 2, **fields}


# (id, method, path, body (dict: JSON, str/bytes: raw), status, expected param or None, text in the message)
CASES = [
    ("malformed-json", "POST", C, b'{"prompt": "x",', 400, None, "JSON"),
    ("json-array-body", "POST", C, b"[1, 2]", 400, None, "JSON object"),
    ("json-string-body", "POST", C, b'"hello"', 400, None, "JSON object"),
    ("empty-body", "POST", C, b"", 400, None, ""),
    ("nan-temperature", "POST", C, b'{"prompt": "x", "temperature": NaN}', 400, "temperature", ""),
    ("missing-prompt", "POST", C, {"model": MODEL_NAME}, 400, "prompt", "prompt"),
    ("prompt-int", "POST", C, comp(prompt=5), 400, "prompt", "prompt"),
    ("prompt-empty-list", "POST", C, comp(prompt=[]), 400, "prompt", "empty"),
    ("prompt-mixed-list", "POST", C, comp(prompt=[1, "a"]), 400, "prompt", ""),
    ("prompt-empty-string", "POST", C, comp(prompt=""), 400, "prompt", "empty"),
    ("token-out-of-vocab", "POST", C, comp(prompt=[5, 999999]), 400, "prompt", "999999"),
    ("token-negative", "POST", C, comp(prompt=[-1]), 400, "prompt", "-1"),
    ("prompt-too-long", "POST", C, comp(prompt=LONG_PROMPT), 400, "prompt", "512"),
    (
        "prompt-plus-max-tokens-too-long",
        "POST",
        C,
        comp(prompt=[5] * 200, max_tokens=390),
        400,
        "max_tokens",
        "512",
    ),
    ("max-tokens-zero", "POST", C, comp(max_tokens=0), 400, "max_tokens", ""),
    ("max-tokens-negative", "POST", C, comp(max_tokens=-3), 400, "max_tokens", ""),
    ("max-tokens-string", "POST", C, comp(max_tokens="10"), 400, "max_tokens", "integer"),
    ("max-tokens-bool", "POST", C, comp(max_tokens=True), 400, "max_tokens", "integer"),
    ("max-tokens-float", "POST", C, comp(max_tokens=2.5), 400, "max_tokens", ""),
    ("max-tokens-over-limit", "POST", C, comp(max_tokens=450), 400, "max_tokens", "--max-tokens-limit"),
    ("temperature-negative", "POST", C, comp(temperature=-1), 400, "temperature", ""),
    ("temperature-string", "POST", C, comp(temperature="hot"), 400, "temperature", "number"),
    ("top-p-zero", "POST", C, comp(top_p=0), 400, "top_p", ""),
    ("top-p-above-one", "POST", C, comp(top_p=1.5), 400, "top_p", ""),
    ("top-k-negative", "POST", C, comp(top_k=-5), 400, "top_k", ""),
    ("top-k-huge", "POST", C, comp(top_k=2**63), 400, "top_k", "2**31"),
    ("stop-token-ids-out-of-vocab", "POST", C, comp(min_tokens=1, stop_token_ids=[99999]), 400, "stop_token_ids",
     "99999"),  # fmt: skip
    ("stop-token-ids-huge", "POST", C, comp(stop_token_ids=[2**63]), 400, "stop_token_ids", ""),
    ("seed-too-large", "POST", C, comp(seed=2**64), 400, "seed", "2**63"),
    ("seed-negative", "POST", C, comp(seed=-1), 400, "seed", ""),
    ("seed-plus-n-too-large", "POST", C, comp(seed=2**63 - 1, n=2), 400, "seed", "n = 2"),
    ("n-zero", "POST", C, comp(n=0), 400, "n", ""),
    ("n-over-limit", "POST", C, comp(n=1000), 400, "n", "--max-n"),
    ("n-huge", "POST", C, comp(n=10**30), 400, "n", ""),
    ("n-string", "POST", C, comp(n="2"), 400, "n", ""),
    ("seed-float", "POST", C, comp(seed=1.5), 400, "seed", ""),
    ("stop-ints", "POST", C, comp(stop=[1, 2]), 400, "stop", ""),
    ("stop-empty-string", "POST", C, comp(stop=[""]), 400, "stop", ""),
    ("logprobs-too-many", "POST", C, comp(logprobs=100), 400, "logprobs", ""),
    ("presence-penalty-range", "POST", C, comp(presence_penalty=5), 400, "presence_penalty", ""),
    ("repetition-penalty-zero", "POST", C, comp(repetition_penalty=0), 400, "repetition_penalty", ""),
    ("min-tokens-above-max", "POST", C, comp(min_tokens=5, max_tokens=2), 400, "min_tokens", ""),
    ("unknown-model", "POST", C, comp(model="gpt-4"), 404, "model", "gpt-4"),
    ("suffix-unsupported", "POST", C, comp(suffix="x"), 400, "suffix", "suffix"),
    ("logit-bias-range", "POST", C, comp(logit_bias={"5": 101}), 400, "logit_bias", "logit_bias"),
    ("logit-bias-vocab", "POST", C, comp(logit_bias={"999999": 1}), 400, "prompt", "logit_bias"),
    ("best-of-above-n", "POST", C, comp(best_of=3), 400, "best_of", "best_of"),
    ("stream-not-bool", "POST", C, comp(stream="yes"), 400, "stream", "boolean"),
    (
        "stream-options-bad",
        "POST",
        C,
        comp(stream=True, stream_options={"include_usage": "x"}),
        400,
        "stream_options.include_usage",
        "",
    ),
    (
        "stream-options-unknown",
        "POST",
        C,
        comp(stream=True, stream_options={"foo": 1}),
        400,
        "stream_options.foo",
        "foo",
    ),
    (
        "stream-options-without-stream",
        "POST",
        C,
        comp(stream_options={"include_usage": True}),
        400,
        "stream_options",
        "stream",
    ),
    ("chat-tool-without-function", "POST", CHAT, chat(tools=[{"type": "function"}]), 400, "tools[0].function", ""),
    (
        "chat-tool-choice-unknown-function",
        "POST",
        CHAT,
        chat(
            tools=[{"type": "function", "function": {"name": "f"}}],
            tool_choice={"type": "function", "function": {"name": "g"}},
        ),
        400,
        "tool_choice",
        "not among the tools",
    ),
    (
        "chat-response-format-type",
        "POST",
        CHAT,
        chat(response_format={"type": "xml"}),
        400,
        "response_format.type",
        "",
    ),
    ("chat-no-messages", "POST", CHAT, {"model": MODEL_NAME}, 400, "messages", "messages"),
    ("chat-empty-messages", "POST", CHAT, chat(messages=[]), 400, "messages", ""),
    ("chat-messages-not-list", "POST", CHAT, chat(messages="hi"), 400, "messages", ""),
    (
        "chat-function-role",
        "POST",
        CHAT,
        chat(messages=[{"role": "function", "content": "x"}]),
        400,
        "messages[0].role",
        "",
    ),
    ("chat-missing-role", "POST", CHAT, chat(messages=[{"content": "x"}]), 400, "messages[0].role", ""),
    (
        "chat-image-part",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content[0].type",
        "image_url",
    ),
    ("chat-top-logprobs-without-logprobs", "POST", CHAT, chat(top_logprobs=2), 400, "top_logprobs", ""),
    (
        "chat-top-logprobs-too-many",
        "POST",
        CHAT,
        chat(logprobs=True, top_logprobs=50),
        400,
        "top_logprobs",
        "",
    ),
    (
        "chat-max-completion-tokens-over-limit",
        "POST",
        CHAT,
        {"model": MODEL_NAME, "messages": MSG, "max_completion_tokens": 10_000},
        400,
        "max_completion_tokens",
        "",
    ),
    ("chat-logprobs-int", "POST", CHAT, chat(logprobs=3), 400, "logprobs", "boolean"),
    (
        "chat-max-tokens-and-max-completion-tokens-differ",
        "POST",
        CHAT,
        chat(max_tokens=5, max_completion_tokens=1),
        400,
        "max_tokens",
        "differ",
    ),
    (
        "chat-continue-final-message-with-generation-prompt",
        "POST",
        CHAT,
        chat(messages=[*MSG, {"role": "assistant", "content": "Hel"}], continue_final_message=True,
             add_generation_prompt=True),
        400,
        "add_generation_prompt",
        "continue_final_message",
    ),  # fmt: skip
    (
        "chat-text-part-without-text",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
        400,
        "messages[0].content[0].text",
        "",
    ),
    (
        "chat-name-the-template-ignores",
        "POST",
        CHAT,
        chat(messages=[{"role": "user", "content": "hi", "name": "bob"}]),
        400,
        "messages",
        "does not use message names",
    ),
    ("tokenize-neither", "POST", "/tokenize", {"model": MODEL_NAME}, 400, "prompt", ""),
    ("detokenize-strings", "POST", "/detokenize", {"tokens": ["a"]}, 400, "tokens[0]", "integer"),
    ("detokenize-out-of-vocab", "POST", "/detokenize", {"tokens": [10**9]}, 400, "tokens", ""),
    ("form-encoded-body", "POST", C, "prompt=hello", 400, None, ""),
    ("wrong-method", "GET", C, None, 405, None, "GET"),
    ("unknown-route", "GET", "/v1/engines", None, 404, None, "/v1/engines"),
    ("unknown-model-card", "GET", "/v1/models/gpt-4", None, 404, None, "gpt-4"),
    ("body-too-large", "POST", C, {"prompt": "x" * (5 << 20)}, 413, None, "bytes"),
    # Lone UTF-16 surrogates (JSON escapes UTF-8 cannot encode): a 400 naming where, never a 500.
    ("surrogate-prompt", "POST", C, b'{"prompt": "\\ud800", "max_tokens": 1}', 400, "prompt", "surrogate"),
    ("surrogate-prompt-list", "POST", C, b'{"prompt": ["a", "b\\udfff"]}', 400, "prompt[1]", "surrogate"),
    ("surrogate-stream", "POST", C, b'{"prompt": "\\ud800", "stream": true}', 400, "prompt", "surrogate"),
    ("surrogate-echo", "POST", C, b'{"prompt": "\\ud800", "echo": true, "logprobs": 1}', 400, "prompt", ""),
    ("surrogate-stop", "POST", C, b'{"prompt": "a", "stop": ["\\ud800"]}', 400, "stop[0]", "surrogate"),
    ("surrogate-key", "POST", C, b'{"prompt": "a", "\\ud800": 1}', 400, None, "surrogate"),
    ("surrogate-model", "POST", CHAT, b'{"model": "\\ud800", "messages": [{"role": "user", "content": "x"}]}', 400,
     "model", "surrogate"),  # fmt: skip
    ("surrogate-part-type", "POST", CHAT,
     b'{"messages": [{"role": "user", "content": [{"type": "\\ud800", "text": "x"}]}]}', 400,
     "messages[0].content[0].type", "surrogate"),  # fmt: skip
    ("surrogate-tokenize", "POST", "/tokenize", b'{"prompt": "\\ud800"}', 400, "prompt", "surrogate"),
    # Bounded work per request.
    ("too-many-prompts", "POST", C, comp(prompt=["a"] * 1025), 400, "prompt", "--max-prompts-per-request"),
    ("too-many-stop-strings", "POST", C, comp(stop=[f"s{i}" for i in range(65)]), 400, "stop", "at most 64"),
    ("stop-string-too-long", "POST", C, comp(stop=["x" * 1025]), 400, "stop", "at most 1024"),
]


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


def _send(http, method, path, body):
    if body is None:
        return http.request(method, path)
    if isinstance(body, dict):
        return http.request(
            method, path, content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
    content = body.encode() if isinstance(body, str) else body
    ctype = "application/x-www-form-urlencoded" if isinstance(body, str) else "application/json"
    return http.request(method, path, content=content, headers={"Content-Type": ctype})


def test_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param", "needle"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_request(http, method, path, body, status, param, needle):
    r = _send(http, method, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not None:
        assert error["param"] == param, error
    assert needle in error["message"], error


def test_405_keeps_its_allow_header(http):
    r = http.get(C)
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
    r = http.delete("/health")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_head_health_for_load_balancers(http):
    r = http.head("/health")
    assert r.status_code == 200 and r.content == b""


def test_server_still_healthy_after_bad_input(server, http):
    assert http.get("/health").status_code == 200
    r = http.post(C, json=comp(max_tokens=3, temperature=0))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    r = http.post(CHAT, json=chat(max_tokens=3))
    assert r.status_code == 200
    assert server.proc.poll() is None
    assert "Traceback" not in server.logs()
