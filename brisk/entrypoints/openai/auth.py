"""API-key check (``Authorization: Bearer KEY``) as a pure ASGI middleware, so it covers every route
(OpenAPI document and ``/metrics`` included) except the ones listed as public (``/health``)."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from brisk.entrypoints.openai.errors import send_error

PUBLIC_PATHS = frozenset({"/health"})


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str, public_paths: Iterable[str] = PUBLIC_PATHS):
        if not api_key:
            raise ValueError("APIKeyMiddleware needs a non-empty api_key.")
        self.app = app
        self._expected = api_key.encode()
        self._public = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self._public:
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        scheme, _, token = given.partition(b" ")
        # compare_digest takes the same time wherever the first difference is; always compare.
        if hmac.compare_digest(token.strip(), self._expected) and scheme.lower() == b"bearer":
            await self.app(scope, receive, send)
            return
        message = "Missing API key: send 'Authorization: Bearer <key>'." if not given else "Incorrect API key provided."
        await send_error(send, message, 401, code="invalid_api_key", headers=[(b"www-authenticate", b"Bearer")])
