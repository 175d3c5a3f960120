"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``, and the handlers that make every
failure (bad JSON, wrong types, unknown routes, engine exceptions) come back in that shape."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Send

logger = logging.getLogger("brisk.server")

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}


class OpenAIError(Exception):
    """An error answered to the client as-is (status + OpenAI-style body)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type or _TYPE_BY_STATUS.get(status_code, "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = headers

    def to_dict(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def to_response(self) -> Response:
        return Response(
            error_body(self.to_dict()), self.status_code, headers=self.headers, media_type="application/json"
        )


def error_body(content: dict[str, Any]) -> bytes:
    """JSON with non-ASCII escaped: a message that quotes the client's text stays encodable even when that text
    holds a lone UTF-16 surrogate (UTF-8 cannot encode one, and Starlette's JSONResponse would raise)."""
    return json.dumps(content, ensure_ascii=True).encode()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(message, status_code=400, param=param, code=code)


async def send_error(
    send: Send, message: str, status_code: int, *, code: str, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """An error response sent straight over ASGI, for middlewares that answer before FastAPI sees the request."""
    body = error_body(OpenAIError(message, status_code=status_code, code=code).to_dict())
    await send(
        {
            "type": "http.response.start",
            "status": status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------------
# pydantic / FastAPI validation errors -> one readable message naming the field


def _param_of(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out += f"[{p}]" if p.isdigit() else f".{p}"
    return out


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}


# JSON's names for Python types, checked in this order (bool before int: a bool is an int).
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for cls, name in _JSON_TYPES.items() if isinstance(value, cls)), type(value).__name__)


def translate_validation_error(exc: RequestValidationError) -> OpenAIError:
    errors = list(exc.errors())
    if not errors:
        return bad_request("Invalid request.")
    # Prefer the most telling error: our own value checks, unknown fields, then type errors and missing fields,
    # the deepest first (a union member that matched the value's shape reports deeper than the others).
    priority = {INVALID_UNICODE: -1, "value_error": 0, "extra_forbidden": 1}
    errors.sort(key=lambda e: (priority.get(e.get("type", ""), 2), -len(e.get("loc", ()))))
    err = errors[0]
    etype = err.get("type", "")
    loc = tuple(err.get("loc", ()))
    # Union types report one error per member; drop the member tags ("str", "list[int]") from the location.
    loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS)))
    param = _param_of(loc)
    value = err.get("input")

    if etype == INVALID_UNICODE:
        path = err.get("ctx", {}).get("path") or None
        where = f"'{path}' holds" if path else "The request body holds"
        return bad_request(
            f"{where} a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair), which is not valid "
            "Unicode text.",
            param=path,
            code="invalid_unicode",
        )
    if etype == "json_invalid":
        detail = err.get("ctx", {}).get("error", "")
        return bad_request(f"The request body is not valid JSON ({detail}).".replace(" ()", ""), code="invalid_json")
    if etype == "extra_forbidden":
        return bad_request(
            f"Unsupported parameter: '{param}'. brisk does not support this field; remove it from the request.",
            param=param,
            code="unsupported_parameter",
        )
    if etype == "missing":
        if param is None:
            return bad_request("The request body is missing; send a JSON object.", code="missing_body")
        return bad_request(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if param is None and etype in ("model_attributes_type", "dict_type", "model_type"):
        got = _type_name(value)
        if isinstance(value, (bytes, bytearray)):
            got = "data that is not JSON (send Content-Type: application/json)"
        return bad_request(f"The request body must be a JSON object, got {got}.", code="invalid_body")
    if etype in _TYPE_WORDS:
        return bad_request(
            f"Invalid type for '{param}': expected {_TYPE_WORDS[etype]}, got {_type_name(value)}.",
            param=param,
            code="invalid_type",
        )
    msg = err.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if param is None:
        return bad_request(f"Invalid request: {msg}.".replace("..", "."), code="invalid_value")
    return bad_request(f"Invalid value for '{param}': {msg}.".replace("..", "."), param=param, code="invalid_value")


INVALID_UNICODE = "invalid_unicode"  # the error type of protocol.reject_surrogates

_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "function-after", "literal", "none"}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> Response:
        return exc.to_response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return translate_validation_error(exc).to_response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"Not found: {request.method} {request.url.path}."
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
        else:
            message = str(exc.detail)
        # Starlette's headers (a 405's Allow) are part of the answer.
        return OpenAIError(message, status_code=exc.status_code, headers=exc.headers).to_response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("Unhandled error while serving %s %s", request.method, request.url.path)
        return OpenAIError(
            f"Internal server error ({type(exc).__name__}); the server's log has the details.",
            status_code=500,
            code="internal_error",
        ).to_response()
