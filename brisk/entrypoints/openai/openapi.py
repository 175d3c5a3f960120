"""The OpenAPI document, made to match what the server does.

FastAPI's generated document lists a 422 that is never returned (validation errors are 400s), omits the statuses
the middlewares and handlers do return (404, 408, 413, 503, 504), has no value ranges, and cannot express the
request shapes our validators check (a prompt's four forms, exactly one of ``prompt`` and ``messages``). This
module rewrites those parts, with the server's own limits (``--max-n``, ``--max-tokens-limit``, the vocabulary,
...) as the ranges, so that a schema-driven fuzzer (schemathesis in CI) finds nothing undocumented."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from brisk.entrypoints.openai.config import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, ServerConfig
from brisk.entrypoints.openai.protocol import ErrorResponse
from brisk.sampling_params import _MAX_LOGPROBS as MAX_LOGPROBS  # the engine's own bound

_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
_DESCRIPTIONS = {
    400: "Invalid request (the message names the field)",
    401: "Missing or wrong API key",
    404: "No such model",
    408: "The request body did not arrive within --body-timeout",
    413: "Request body over --max-request-body-bytes",
    500: "The engine failed on this request",
    503: "Overloaded (Retry-After), or the engine is not running or is stalled",
    504: "The request ran past --request-timeout",
}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": _DESCRIPTIONS[s], **_ERROR} for s in statuses}


def _non_null(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of an optional field's schema (``anyOf: [X, null]``), else the schema itself."""
    for branch in schema.get("anyOf", ()):
        if branch.get("type") != "null":
            return branch
    return schema


def openapi_document(app: FastAPI, config: ServerConfig, max_model_len: int, vocab_size: int | None) -> dict:
    doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    schemas = doc["components"]["schemas"]
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    _, error_schemas = models_json_schema(
        [(ErrorResponse, "serialization")], ref_template="#/components/schemas/{model}"
    )
    schemas.update(error_schemas["$defs"])
    engine_errors = (400, 401, 500, 503)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            responses.pop("422", None)
            for status in [s for s in responses if s != "200"]:
                del responses[status]
            if path == "/health":
                responses.update(_errors(503))
                continue
            # 503 anywhere: the connection cap's answer comes before any routing.
            statuses: tuple[int, ...] = (401, 503) if path in ("/metrics", "/version", "/v1/models") else engine_errors
            if method == "post":  # every POST route names a model: another is a 404
                statuses += (404, 408, 413)
            if path == "/v1/models/{model_id}":
                statuses = (401, 404, 503)
            if path.startswith("/v1/responses/"):  # no response is kept: every id is unknown
                del responses["200"]
                statuses = (401, 404, 503) + ((400, 408, 413) if method == "post" else ())
            if path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
                statuses += (504,)
                # With stream: true, server-sent events: each a chunk (or an error) object, the last "[DONE]" (the
                # Responses API's: named events, and no "[DONE]").
                responses["200"]["content"]["text/event-stream"] = {
                    "schema": {"anyOf": [{"type": "object"}, {"type": "string", "enum": ["[DONE]"]}]}
                }
            responses.update(_errors(*statuses))
    _request_ranges(schemas, config, max_model_len, vocab_size)
    return doc


def _request_ranges(schemas: dict, config: ServerConfig, max_model_len: int, vocab_size: int | None) -> None:
    token_id: dict[str, Any] = {"type": "integer", "minimum": 0}
    if vocab_size is not None:
        token_id["maximum"] = vocab_size - 1
    max_tokens = {"minimum": 1, "maximum": min(config.max_tokens_limit or max_model_len, max_model_len - 1)}
    stop_string = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_STRING_CHARS}
    shared = {
        "n": {"minimum": 1, "maximum": config.max_n},
        "temperature": {"minimum": 0, "maximum": 100},
        "top_p": {"exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"minimum": -1, "maximum": 2**31 - 1},
        "min_p": {"minimum": 0, "maximum": 1},
        "min_tokens": {"minimum": 0},
        "seed": {"minimum": 0, "maximum": 2**63 - 1},
        "presence_penalty": {"minimum": -2, "maximum": 2},
        "frequency_penalty": {"minimum": -2, "maximum": 2},
        "repetition_penalty": {"exclusiveMinimum": 0, "maximum": 10},
        "max_tokens": max_tokens,
    }
    logprobs = {"minimum": 0, "maximum": MAX_LOGPROBS}
    for name, ranges in (
        ("CompletionRequest", {**shared, "logprobs": logprobs, "best_of": {"minimum": 1}}),
        ("ChatCompletionRequest", {**shared, "max_completion_tokens": max_tokens, "top_logprobs": logprobs}),
        ("ResponsesRequest", {**{k: v for k, v in shared.items() if k not in ("n", "min_tokens", "max_tokens")},
                              "max_output_tokens": max_tokens, "top_logprobs": logprobs}),
    ):  # fmt: skip
        properties = schemas[name]["properties"]
        for field, constraints in ranges.items():
            _non_null(properties[field]).update(constraints)
        if name == "ResponsesRequest":
            continue
        _non_null(properties["stop_token_ids"])["items"] = token_id
        stop = properties["stop"]
        stop.update(
            anyOf=[stop_string, {"type": "array", "items": stop_string, "maxItems": MAX_STOP_STRINGS}, {"type": "null"}]
        )
    prompt_ids = {"type": "array", "items": token_id, "minItems": 1, "maxItems": max_model_len - 1}
    schemas["CompletionRequest"]["properties"]["prompt"].update(
        anyOf=[
            {"type": "string"},  # (whether "" is empty depends on the tokenizer adding a BOS)
            {"type": "array", "items": {"type": "string"}, "minItems": 1,
             "maxItems": config.max_prompts_per_request},
            prompt_ids,
            {"type": "array", "items": prompt_ids, "minItems": 1, "maxItems": config.max_prompts_per_request},
        ]
    )  # fmt: skip
    # Exactly one of prompt and messages (the other absent or null).
    messages = {"type": "array", "items": {"$ref": "#/components/schemas/ChatMessage"}, "minItems": 1}
    schemas["TokenizeRequest"]["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": messages, "prompt": {"type": "null"}}},
    ]
    schemas["TextContentPart"]["properties"]["type"]["enum"] = ["text"]
    _non_null(schemas["DetokenizeRequest"]["properties"]["tokens"])["items"] = token_id
