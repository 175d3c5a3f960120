"""Every request field in docs/serving.md's table ("Which fields are accepted") behaves as the table says, on the
real server: implemented fields have their effect, fields whose value asks for nothing change nothing (the same
greedy reply as without them), and fields asking for what brisk lacks are a 400 naming the field.

The table is read from the docs, and every field it names must have a case here: a row added to the docs without
a case, or a case for a field the docs do not list, fails the test."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import MODEL_NAME

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
C, CHAT = "/v1/completions", "/v1/chat/completions"
BASE = {
    C: {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0, "ignore_eos": True},
    CHAT: {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
    },
}
TOKEN = 65  # a token id of the tiny model's vocabulary, forced by logit_bias / allowed_token_ids


def table_fields() -> set[str]:
    """The field names in the first column of the docs' table of request fields."""
    text = DOC.read_text()
    table = text.split("#### Which fields are accepted", 1)[1].split("####", 1)[0]
    fields = set()
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith(("| field", "| ---")):
            fields.update(re.findall(r"`([a-z_.]+)`", line.split("|")[1]))
    return fields


class Ctx:
    """What a check sees: the response, and a way to ask the server more (the baseline, /detokenize)."""

    def __init__(self, http: httpx.Client, path: str, response: httpx.Response):
        self.http, self.path, self.response = http, path, response

    def json(self) -> dict:
        return self.response.json()

    def events(self) -> list[dict]:
        """A stream's JSON events (the final [DONE] left out)."""
        lines = [line[6:] for line in self.response.text.splitlines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [json.loads(line) for line in lines[:-1]]

    def baseline(self) -> dict:
        return self.http.post(self.path, json=BASE[self.path]).json()

    def text(self, body: dict | None = None) -> str:
        choice = (body or self.json())["choices"][0]
        return choice["text"] if "text" in choice else choice["message"]["content"]

    def detokenize(self, ids: list[int]) -> str:
        return self.http.post("/detokenize", json={"model": MODEL_NAME, "tokens": ids}).json()["prompt"]


Check = Callable[[Ctx], Any]


def same_as_baseline(ctx: Ctx) -> None:
    assert ctx.text() == ctx.text(ctx.baseline())


def usage(key: str, value: int) -> Check:
    def check(ctx: Ctx) -> None:
        assert ctx.json()["usage"][key] == value, ctx.json()["usage"]

    return check


def choices(count: int) -> Check:
    def check(ctx: Ctx) -> None:
        assert len(ctx.json()["choices"]) == count

    return check


def forced_token(ctx: Ctx) -> None:
    assert ctx.text() == ctx.detokenize([TOKEN] * 4)


def accepted(ctx: Ctx) -> None:
    """Implemented with an effect a random tiny model cannot show reliably (sampling knobs): a valid reply.
    Their effects are tested against references in tests/engine/test_sampling.py."""
    assert ctx.json()["choices"]


def streamed(ctx: Ctx) -> None:
    """Server-sent events whose deltas add up to the reply sent whole (deltas may merge several tokens)."""
    assert ctx.response.headers["content-type"].startswith("text/event-stream")
    deltas = [c.get("text", c.get("delta", {}).get("content")) or "" for e in ctx.events() for c in e["choices"]]
    assert "".join(deltas) == ctx.text(ctx.baseline())


def last_chunk_usage(ctx: Ctx) -> None:
    events = ctx.events()
    assert not events[-1]["choices"] and events[-1]["usage"]["completion_tokens"] == 4


def usage_on_every_chunk(ctx: Ctx) -> None:
    counts = [e["usage"]["completion_tokens"] for e in ctx.events()]
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == 4, counts


def logprobs_present(ctx: Ctx) -> None:
    assert ctx.json()["choices"][0]["logprobs"]


def two_top_logprobs(ctx: Ctx) -> None:
    assert all(len(t["top_logprobs"]) == 2 for t in ctx.json()["choices"][0]["logprobs"]["content"])


def echoed(ctx: Ctx) -> None:
    assert ctx.text().startswith(BASE[C]["prompt"])


def one_of(*texts: str) -> Check:
    def check(ctx: Ctx) -> None:
        assert ctx.text() in texts, ctx.text()

    return check


def token_ids_named(ctx: Ctx) -> None:
    assert ctx.json()["choices"][0]["logprobs"]["tokens"] == [f"token_id:{TOKEN}"] * 4


def fewer_prompt_tokens(ctx: Ctx) -> None:
    assert ctx.json()["usage"]["prompt_tokens"] < ctx.baseline()["usage"]["prompt_tokens"]


def stopped_at(stop: str) -> Check:
    def check(ctx: Ctx) -> None:
        choice = ctx.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop, choice

    return check


def response_id(expected: str) -> Check:
    def check(ctx: Ctx) -> None:
        assert ctx.json()["id"] == expected

    return check


def listed_logprobs(ctx: Ctx) -> None:
    """logprob_token_ids: each position's alternatives are the listed tokens and the chosen one, with the logprobs
    a top-5 request (the reference) gives them wherever it has them."""
    body = {**BASE[C], "logprobs": 5, "return_tokens_as_token_ids": True}
    ref = ctx.http.post(C, json=body).json()["choices"][0]["logprobs"]
    got = ctx.json()["choices"][0]["logprobs"]
    assert got["tokens"] == ref["tokens"] and got["token_logprobs"] == pytest.approx(ref["token_logprobs"], abs=1e-4)
    for token, tops, ref_tops in zip(got["tokens"], got["top_logprobs"], ref["top_logprobs"], strict=True):
        assert set(tops) == {f"token_id:{t}" for t in LISTED} | {token}, tops
        for name, value in tops.items():
            if name in ref_tops:
                assert value == pytest.approx(ref_tops[name], abs=1e-4), (name, tops, ref_tops)


def listed_chat_logprobs(ctx: Ctx) -> None:
    for t in ctx.json()["choices"][0]["logprobs"]["content"]:
        assert {a["token"] for a in t["top_logprobs"]} == {f"token_id:{i}" for i in LISTED} | {t["token"]}, t


def repetition(ctx: Ctx) -> None:
    choice = ctx.json()["choices"][0]
    assert choice["finish_reason"] == "repetition" and ctx.json()["usage"]["completion_tokens"] == 3, ctx.json()


def token_ids_returned(ctx: Ctx) -> None:
    body, choice = ctx.json(), ctx.json()["choices"][0]
    prompt_ids = body["prompt_token_ids"] if ctx.path == CHAT else choice["prompt_token_ids"]
    assert len(prompt_ids) == body["usage"]["prompt_tokens"] and len(choice["token_ids"]) == 4
    assert ctx.detokenize(choice["token_ids"]) == ctx.text()
    if ctx.path == C:
        tokenized = ctx.http.post("/tokenize", json={"model": MODEL_NAME, "prompt": BASE[C]["prompt"]}).json()
        assert prompt_ids == tokenized["tokens"]


def streamed_token_ids(ctx: Ctx) -> None:
    whole = ctx.http.post(ctx.path, json={**BASE[ctx.path], "return_token_ids": True}).json()
    events = ctx.events()
    if ctx.path == CHAT:
        prompt = [e.get("prompt_token_ids") for e in events]
        assert prompt[0] == whole["prompt_token_ids"] and not any(prompt[1:])
    else:
        prompt = [c["prompt_token_ids"] for e in events for c in e["choices"]]
        assert prompt[0] == whole["choices"][0]["prompt_token_ids"] and not any(prompt[1:])
    ids = [t for e in events for c in e["choices"] for t in c.get("token_ids") or []]
    assert ids == whole["choices"][0]["token_ids"]


def prompt_logprobs_as_echo(ctx: Ctx) -> None:
    """vLLM's prompt_logprobs (here 2): an entry a prompt token, None for the first, each holding the prompt's
    token (its logprob the one echo with logprobs reports) and the top two alternatives, ranked from 1."""
    body = ctx.json()
    where = body if ctx.path == CHAT else body["choices"][0]
    positions, prompt_ids = where["prompt_logprobs"], where["prompt_token_ids"]
    assert len(positions) == len(prompt_ids) == body["usage"]["prompt_tokens"] and positions[0] is None
    echo = {"model": MODEL_NAME, "prompt": prompt_ids, "echo": True, "logprobs": 2, "max_tokens": 1}
    echoed_logprobs = ctx.http.post(C, json=echo).json()["choices"][0]["logprobs"]["token_logprobs"]
    for i, (token, position) in enumerate(zip(prompt_ids[1:], positions[1:], strict=True), start=1):
        assert str(token) in position and {1, 2} <= {e["rank"] for e in position.values()}, position
        assert len(position) <= 3 and all(e["rank"] <= 2 for t, e in position.items() if t != str(token))
        assert position[str(token)]["logprob"] == pytest.approx(echoed_logprobs[i], abs=1e-4)
    assert positions[1][str(prompt_ids[1])]["decoded_token"] == ctx.detokenize([prompt_ids[1]])


def prompt_ids_are(expected: list[int]) -> Check:
    def check(ctx: Ctx) -> None:
        assert ctx.json()["choices"][0]["prompt_token_ids"] == expected

    return check


BAD = "400"
LISTED = [TOKEN, 66, 67]
CONTINUE = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Well"}]
JSON_CHOICE = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["yes", "no"]}}}
NAMED_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

# field -> [(path, extra body, check or BAD)]; the base request's own fields (model, prompt, messages) need none
CASES: dict[str, list[tuple[str, dict, Check | str]]] = {
    "model": [(C, {}, accepted), (C, {"model": "no-such-model"}, "404")],
    "messages": [(CHAT, {}, accepted)],
    "prompt": [(C, {"prompt": [1, 2, 3]}, usage("prompt_tokens", 3))],
    "max_tokens": [(C, {"max_tokens": 2}, usage("completion_tokens", 2))],
    "max_completion_tokens": [(CHAT, {"max_tokens": None, "max_completion_tokens": 2}, usage("completion_tokens", 2))],
    "n": [(C, {"n": 3, "temperature": 1.0, "seed": 1}, choices(3)), (CHAT, {"n": 2}, choices(2))],
    "temperature": [(C, {"temperature": 1.5, "seed": 3}, accepted)],
    "top_p": [(C, {"temperature": 1.0, "top_p": 0.5, "seed": 3}, accepted)],
    "stop": [(C, {"max_tokens": 8, "stop": ["zzz-never"]}, usage("completion_tokens", 8))],
    "seed": [(C, {"temperature": 1.0, "seed": 7}, accepted)],
    "presence_penalty": [(C, {"presence_penalty": 1.5}, accepted)],
    "frequency_penalty": [(C, {"frequency_penalty": 1.5}, accepted)],
    "stream": [(C, {"stream": True}, streamed), (CHAT, {"stream": True}, streamed)],
    "stream_options.include_usage": [
        (C, {"stream": True, "stream_options": {"include_usage": True}}, last_chunk_usage),
    ],
    "stream_options.continuous_usage_stats": [
        (CHAT, {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
         usage_on_every_chunk),
    ],
    "logprobs": [(C, {"logprobs": 1}, logprobs_present), (CHAT, {"logprobs": True}, logprobs_present)],
    "top_logprobs": [(CHAT, {"logprobs": True, "top_logprobs": 2}, two_top_logprobs)],
    "echo": [(C, {"echo": True}, echoed)],
    "response_format": [
        (C, {"response_format": {"type": "text"}}, same_as_baseline),
        (CHAT, {"max_tokens": 16, "response_format": JSON_CHOICE}, one_of('"yes"', '"no"')),
        (CHAT, {"response_format": {"type": "xml"}}, BAD),
    ],
    "structured_outputs": [
        (C, {"max_tokens": 16, "structured_outputs": {"choice": ["left", "right"]}}, one_of("left", "right")),
        (C, {"structured_outputs": {"structural_tag": "{}"}}, BAD),
    ],
    "tools": [(CHAT, {"tools": [NAMED_TOOL], "tool_choice": "none"}, accepted)],
    "tool_choice": [
        (CHAT, {"tools": [NAMED_TOOL], "tool_choice": "none"}, accepted),
        (CHAT, {"tools": [NAMED_TOOL], "tool_choice": "auto"}, BAD),  # this server has no --tool-call-parser
    ],
    "parallel_tool_calls": [(CHAT, {"parallel_tool_calls": True}, same_as_baseline)],
    "logit_bias": [(C, {"logit_bias": {}}, same_as_baseline), (C, {"logit_bias": {str(TOKEN): 100}}, forced_token)],
    "bad_words": [(C, {"bad_words": []}, same_as_baseline)],
    "allowed_token_ids": [(C, {"allowed_token_ids": [TOKEN]}, forced_token)],
    "top_k": [(C, {"temperature": 1.0, "top_k": 1}, same_as_baseline)],  # top-1 sampling is greedy
    "min_p": [(C, {"temperature": 1.0, "min_p": 1.0}, same_as_baseline)],  # only the top token survives
    "repetition_penalty": [(C, {"repetition_penalty": 1.3}, accepted)],
    "min_tokens": [(C, {"ignore_eos": False, "min_tokens": 4}, usage("completion_tokens", 4))],
    "ignore_eos": [(C, {"ignore_eos": True, "max_tokens": 12}, usage("completion_tokens", 12))],
    "stop_token_ids": [(C, {"allowed_token_ids": [TOKEN], "stop_token_ids": [TOKEN]}, stopped_at(TOKEN))],
    "skip_special_tokens": [(C, {"skip_special_tokens": False}, accepted)],
    "include_stop_str_in_output": [(C, {"include_stop_str_in_output": True}, same_as_baseline)],  # no stop met
    "spaces_between_special_tokens": [(C, {"spaces_between_special_tokens": False}, same_as_baseline)],
    "add_special_tokens": [(C, {"add_special_tokens": True}, same_as_baseline)],  # completions' default
    "truncate_prompt_tokens": [(C, {"truncate_prompt_tokens": 2}, usage("prompt_tokens", 2))],
    "return_tokens_as_token_ids": [
        (C, {"logprobs": 0, "allowed_token_ids": [TOKEN], "return_tokens_as_token_ids": True}, token_ids_named)
    ],
    "request_id": [(C, {"request_id": "fields-1"}, response_id("cmpl-fields-1"))],
    "chat_template_kwargs": [(CHAT, {"chat_template_kwargs": {}}, same_as_baseline)],
    "add_generation_prompt": [
        (CHAT, {"add_generation_prompt": False}, fewer_prompt_tokens),
        (CHAT, {"messages": CONTINUE, "add_generation_prompt": True, "continue_final_message": True}, BAD),
    ],
    "continue_final_message": [
        (CHAT, {"messages": CONTINUE, "add_generation_prompt": False, "continue_final_message": True}, accepted),
    ],
    "best_of": [(C, {"n": 2, "best_of": 2, "temperature": 1.0}, choices(2)), (C, {"best_of": 3}, BAD)],
    "user": [(C, {"user": "someone"}, same_as_baseline)],
    "metadata": [(CHAT, {"metadata": {"k": "v"}}, same_as_baseline)],
    "store": [(CHAT, {"store": False}, same_as_baseline), (CHAT, {"store": True}, BAD)],
    "service_tier": [(C, {"service_tier": "auto"}, same_as_baseline), (C, {"service_tier": "flex"}, BAD)],
    "priority": [(C, {"priority": 0}, same_as_baseline), (C, {"priority": 5}, BAD)],
    "logprob_token_ids": [
        (C, {"logprobs": 1, "logprob_token_ids": LISTED, "return_tokens_as_token_ids": True}, listed_logprobs),
        (CHAT, {"logprobs": True, "logprob_token_ids": LISTED, "return_tokens_as_token_ids": True},
         listed_chat_logprobs),
        (C, {"logprob_token_ids": LISTED}, BAD),  # needs logprobs
        (C, {"logprobs": 1, "logprob_token_ids": [10**9]}, BAD),
    ],
    "repetition_detection": [
        (C, {"allowed_token_ids": [TOKEN], "max_tokens": 12,
             "repetition_detection": {"max_pattern_size": 1, "min_pattern_size": 1, "min_count": 3}}, repetition),
        (C, {"repetition_detection": {"max_pattern_size": 2, "min_count": 1}}, BAD),
    ],
    "thinking_token_budget": [(C, {"thinking_token_budget": -1}, same_as_baseline),
                              (CHAT, {"thinking_token_budget": 8}, BAD)],
    "return_token_ids": [
        (C, {"return_token_ids": True}, token_ids_returned), (CHAT, {"return_token_ids": True}, token_ids_returned),
        (C, {"return_token_ids": True, "stream": True}, streamed_token_ids),
        (CHAT, {"return_token_ids": True, "stream": True}, streamed_token_ids),
    ],
    "truncation_side": [
        (C, {"prompt": [5, 6, 7, 8], "truncate_prompt_tokens": 2, "truncation_side": "right",
             "return_token_ids": True}, prompt_ids_are([5, 6])),
        (C, {"prompt": [5, 6, 7, 8], "truncate_prompt_tokens": 2, "truncation_side": "left",
             "return_token_ids": True}, prompt_ids_are([7, 8])),
    ],
    "include_reasoning": [(CHAT, {"include_reasoning": False}, same_as_baseline)],  # effect: test_structured_and_tools
    "documents": [(CHAT, {"documents": [{"title": "t", "text": "x"}]}, accepted)],  # effect: test_template_kwargs
    "reasoning_effort": [(CHAT, {"reasoning_effort": "low"}, accepted), (CHAT, {"reasoning_effort": "huge"}, BAD)],
    "use_beam_search": [(C, {"use_beam_search": False}, same_as_baseline), (CHAT, {"use_beam_search": True}, BAD)],
    "return_token_offsets": [(C, {"return_token_offsets": True}, BAD)],
    "return_prompt_text": [(CHAT, {"return_prompt_text": False}, same_as_baseline),
                           (CHAT, {"return_prompt_text": True}, BAD)],
    "return_assistant_tokens_mask": [(CHAT, {"return_assistant_tokens_mask": True}, BAD)],
    "length_penalty": [(C, {"length_penalty": 1.0}, same_as_baseline), (C, {"length_penalty": 2.0}, BAD)],
    "prompt_logprobs": [
        (C, {"prompt_logprobs": 2, "return_token_ids": True}, prompt_logprobs_as_echo),
        (CHAT, {"prompt_logprobs": 2, "return_token_ids": True}, prompt_logprobs_as_echo),
        (CHAT, {"prompt_logprobs": 0, "stream": True}, streamed), (C, {"prompt_logprobs": 1, "stream": True}, BAD),
        (C, {"prompt_logprobs": 21}, BAD),
    ],
    "cache_salt": [(CHAT, {"cache_salt": "s3cret"}, same_as_baseline), (C, {"cache_salt": ""}, BAD)],
    "chat_template": [(CHAT, {"chat_template": "{{ messages }}"}, BAD)],
    "suffix": [(C, {"suffix": "end"}, BAD)],
    "prompt_embeds": [(C, {"prompt_embeds": "AAAA"}, BAD)],
    "kv_transfer_params": [(C, {"kv_transfer_params": {}}, same_as_baseline),
                           (C, {"kv_transfer_params": {"do_remote_decode": True}}, BAD)],
    "ec_transfer_params": [(CHAT, {"ec_transfer_params": {"x": 1}}, BAD)],
    "vllm_xargs": [(C, {"vllm_xargs": {}}, same_as_baseline), (C, {"vllm_xargs": {"a": 1}}, BAD)],
    "media_io_kwargs": [(CHAT, {"media_io_kwargs": {"image": {}}}, BAD)],
    "mm_processor_kwargs": [(CHAT, {"mm_processor_kwargs": {}}, same_as_baseline),
                            (CHAT, {"mm_processor_kwargs": {"fps": 1}}, BAD)],
    "audio": [(CHAT, {"audio": {"voice": "alloy", "format": "wav"}}, BAD)],
    "modalities": [(CHAT, {"modalities": ["text", "audio"]}, BAD)],
    "prediction": [(CHAT, {"prediction": {"type": "content", "content": "x"}}, BAD)],
    "web_search_options": [(CHAT, {"web_search_options": {}}, BAD)],
    "function_call": [(CHAT, {"function_call": "auto"}, BAD)],
    "functions": [(CHAT, {"functions": [NAMED_TOOL["function"]]}, BAD)],
}  # fmt: skip


def test_every_field_in_the_docs_has_a_case():
    assert table_fields() == set(CASES), {"in the docs only": table_fields() - set(CASES),
                                          "here only": set(CASES) - table_fields()}  # fmt: skip


# Every vLLM 0.26 extension field at vLLM's default value, as a vLLM client may send them all.
VLLM_DEFAULTS = {
    "use_beam_search": False,
    "length_penalty": 1.0,
    "truncation_side": None,
    "prompt_logprobs": None,
    "logprob_token_ids": None,
    "return_token_ids": None,
    "return_token_offsets": False,
    "cache_salt": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "vllm_xargs": None,
    "repetition_detection": None,
    "thinking_token_budget": None,
}
VLLM_DEFAULTS_BY_PATH = {
    C: {**VLLM_DEFAULTS, "suffix": None, "prompt_embeds": None},
    CHAT: {**VLLM_DEFAULTS, "chat_template": None, "documents": None, "include_reasoning": True,
           "media_io_kwargs": None, "mm_processor_kwargs": None, "reasoning_effort": None,
           "return_assistant_tokens_mask": False, "return_prompt_text": None},
}  # fmt: skip


@pytest.mark.parametrize("path", [C, CHAT])
def test_every_vllm_field_at_its_default_is_accepted(http, path):
    response = http.post(path, json={**BASE[path], **VLLM_DEFAULTS_BY_PATH[path]})
    assert response.status_code == 200, response.text
    ctx = Ctx(http, path, response)
    same_as_baseline(ctx)
    assert "token_ids" not in ctx.json()["choices"][0] and "prompt_token_ids" not in ctx.json()


def test_cache_salt_keeps_prefixes_apart(http):
    """A prompt's cached blocks serve later requests of the same salt only (vLLM's cache_salt: one tenant cannot
    learn from its timings which prompts another sent); the replies stay the plain greedy one."""
    body = {**BASE[C], "prompt": "Salted prefixes stay apart: " + "pack my box with five dozen liquor jugs " * 4}

    def send(salt: str | None) -> tuple[int, str]:
        reply = http.post(C, json=body if salt is None else {**body, "cache_salt": salt}).json()
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"], reply["choices"][0]["text"]

    cached, text = zip(*[send(salt) for salt in (None, "tenant-a", "tenant-a", "tenant-b", None, "tenant-b")])
    assert cached[0] == cached[1] == cached[3] == 0, cached
    assert min(cached[2], cached[4], cached[5]) > 0, cached
    assert len(set(text)) == 1


def test_template_kwargs():
    """documents and reasoning_effort reach the chat template as vLLM passes them."""
    from brisk.entrypoints.openai.protocol import ChatCompletionRequest
    from brisk.entrypoints.openai.serving_chat import template_kwargs

    def kwargs(**fields):
        return template_kwargs(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields))

    docs = [{"title": "t", "text": "x"}]
    assert kwargs() is None
    assert kwargs(documents=docs, chat_template_kwargs={"a": 1}) == {"a": 1, "documents": docs}
    assert kwargs(reasoning_effort="none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert kwargs(reasoning_effort="high") == {"reasoning_effort": "high", "enable_thinking": True}
    assert kwargs(reasoning_effort="low", chat_template_kwargs={"enable_thinking": False}) == {
        "enable_thinking": False, "reasoning_effort": "low"}  # fmt: skip


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


@pytest.mark.parametrize(
    ("field", "path", "extra", "expect"),
    [(field, *case) for field, cases in CASES.items() for case in cases],
    ids=[f"{field}-{i}" for field, cases in CASES.items() for i in range(len(cases))],
)
def test_field_behaves_as_the_docs_say(http, field, path, extra, expect):
    body = {k: v for k, v in {**BASE[path], **extra}.items() if v is not None}
    response = http.post(path, json=body)
    if isinstance(expect, str):  # an error status
        assert response.status_code == int(expect), response.text
        if expect == BAD:
            param = response.json()["error"]["param"]  # the field, or a part of it (response_format.type)
            assert param.split(".")[0] == field.split(".")[0], response.json()
        return
    assert response.status_code == 200, response.text
    expect(Ctx(http, path, response))
