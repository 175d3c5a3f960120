"""Request and response models of the OpenAI-compatible API.

Requests forbid unknown fields (``extra="forbid"``) and use strict types, so a field brisk does not know or a
value of the wrong type is a 400 naming it, never silently ignored. Fields OpenAI clients send with values that
ask for nothing (``store: false``, ``metadata``, ``service_tier: "auto"``) are accepted; a value that asks for
behaviour brisk lacks is a 400 (docs/serving.md has the table). Ranges are checked by
:class:`brisk.SamplingParams` when the request is turned into one.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

# ------------------------------------------------------------------------------------------
# requests


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _is_text(value: str) -> bool:
    """False for a string holding a lone UTF-16 surrogate (JSON's ``"\\ud800"``): no tokenizer, log line or
    response can encode it as UTF-8."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_path(body: Any) -> str | None:
    """The location (``messages[0].content``) of the first string, or object key, that is not valid Unicode;
    ``""`` for a bad key of the body itself; None when every string is valid."""
    todo: list[tuple[Any, str]] = [(body, "")]
    while todo:
        value, path = todo.pop()
        if isinstance(value, str):
            if not _is_text(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _is_text(key):
                    return path
                todo.append((item, f"{path}.{key}" if path else key))
        elif isinstance(value, list):
            todo.extend((item, f"{path}[{i}]") for i, item in enumerate(value) if not isinstance(item, int))
    return None


class _Body(_Request):
    """A request body: every string in it (values and keys, at any depth) must be valid Unicode, or the request
    is a 400 naming where (``errors.INVALID_UNICODE``), before any field is read."""

    @model_validator(mode="before")
    @classmethod
    def _reject_surrogates(cls, data: Any) -> Any:
        path = _surrogate_path(data)
        if path is not None:
            raise PydanticCustomError("invalid_unicode", "a string is not valid Unicode", {"path": path})
        return data


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage (so far) on every chunk


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class RepetitionDetection(_Request):
    """vLLM's ``repetition_detection``: end a completion (``finish_reason: "repetition"``) once its last tokens
    are one pattern repeated ``min_count`` times (``max_pattern_size: 0`` turns it off)."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_stop(value: Any) -> str | list[str] | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return value
    raise ValueError("expected a string or an array of strings")


class _SamplingFields(_Body):
    """Fields shared by completions and chat completions."""

    model: str | None = Field(None, description="Served model name; defaults to the (only) served model.")
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    stop: Any = Field(None, description="A string or an array of strings; never part of the output.")
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(
        None, description="An end-user id, accepted for compatibility with OpenAI clients; brisk does not use it."
    )
    # brisk / vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # brisk's tokenizers are fast ones, which add no such spaces
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    truncate_prompt_tokens: int | None = Field(None, description="Keep only the last N prompt tokens.")
    return_tokens_as_token_ids: bool = False
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's structured outputs: one of json, regex, choice, grammar, json_object."
    )
    # accepted for compatibility; values that ask for something brisk does not do are 400s
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    priority: int = 0
    request_id: str | None = None
    # vLLM 0.26's server extensions. Wired: logprob_token_ids, repetition_detection, thinking_token_budget (None or
    # -1), return_token_ids, truncation_side, prompt_logprobs, cache_salt. The others are accepted only with values
    # that ask for nothing (serving_engine.check_vllm_extension_fields).
    logprob_token_ids: list[int] | None = Field(
        None, description="Token ids whose logprobs are returned at each generated position (needs logprobs)."
    )
    repetition_detection: RepetitionDetection | None = None
    thinking_token_budget: int | None = Field(None, description="None or -1 (unlimited) only.")
    return_token_ids: bool | None = Field(
        None, description="Add prompt_token_ids and each choice's token_ids to the response (and stream chunks)."
    )
    truncation_side: Literal["left", "right"] | None = Field(
        None, description="With truncate_prompt_tokens: 'left' (default) keeps the last N tokens, 'right' the first."
    )
    use_beam_search: bool = False
    length_penalty: float = 1.0
    prompt_logprobs: int | None = None
    return_token_offsets: bool | None = False
    cache_salt: str | None = Field(
        None, description="Prefix-cache blocks are shared only among requests of the same salt (a secret per tenant)."
    )
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None

    @field_validator("stop")
    @classmethod
    def _validate_stop(cls, value: Any) -> Any:
        return _check_stop(value)


class CompletionRequest(_SamplingFields):
    prompt: Any = Field(
        ...,
        description="A string, an array of strings, an array of token ids or an array of token-id arrays.",
    )
    max_tokens: int | None = 16
    logprobs: int | None = Field(None, description="Number of top alternatives per position (0 = only chosen).")
    echo: bool = False
    best_of: int | None = Field(None, description="Only accepted when equal to n (no server-side reranking).")
    add_special_tokens: bool = True
    suffix: str | None = None
    prompt_embeds: str | list[str] | None = None

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value:
            if all(isinstance(p, str) for p in value):
                return value
            if all(_is_int(t) for t in value):
                return value
            if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in value):
                return value
        if isinstance(value, list) and not value:
            raise ValueError("the prompt must not be empty")
        raise ValueError("expected a string, an array of strings, an array of token ids or an array of token-id arrays")


class TextContentPart(_Request):
    type: str
    text: str

    @field_validator("type")
    @classmethod
    def _only_text(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content part type {ascii(value)} is not supported; only 'text' parts are")
        return value


class FunctionCall(_Request):
    name: str
    arguments: str


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = None
    max_tokens: int | None = Field(None, description="Deprecated alias of max_completion_tokens.")
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # the chat template already places the special tokens
    echo: bool = False  # vLLM: the reply starts with the last message's content when it is the assistant's
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM 0.26's chat extensions: include_reasoning, documents and reasoning_effort are wired; the others are
    # accepted only with values that ask for nothing.
    include_reasoning: bool = True
    documents: list[dict[str, str]] | None = Field(None, description="Passed to the chat template (RAG templates).")
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="Passed to the chat template, with enable_thinking (false for 'none') unless set."
    )
    chat_template: str | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    return_prompt_text: bool | None = None
    return_assistant_tokens_mask: bool = False


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


# ------------------------------------------------------------------------------------------
# responses (the non-streamed ones; stream chunks are built as dicts in the serving modules)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's entry of ``prompt_logprobs``: one token's logprob at a prompt position, its rank and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's ``prompt_logprobs`` of a response: per prompt position (None for the first), the prompt's token and the
# top alternatives by token id.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids only
    token_ids: list[int] | None = None  # return_token_ids only
    prompt_logprobs: PromptLogprobs | None = None  # prompt_logprobs (or echo with logprobs) only


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids only


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids only
    prompt_logprobs: PromptLogprobs | None = None  # prompt_logprobs only


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "brisk"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
