"""Request body limits as a pure ASGI middleware: a declared ``Content-Length`` over the size limit, or a
(chunked) body that grows past it, gets 413 without the body ever being held in memory; a body that does not
arrive whole within ``body_timeout`` seconds (a client trickling bytes) gets 408 and its connection is closed.
A client that leaves before its body is complete is not answered, and the app never sees its request."""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brisk.entrypoints.openai.errors import send_error


class _ClientLeft(Exception):
    pass


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float | None = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout

    async def _reject(self, receive: Receive, send: Send, more_body: bool) -> None:
        # Read and drop the rest of the body first (within reason): closing a socket that still holds unread
        # data makes the kernel send a reset, and the client may then never see this answer.
        received, drain_limit = 0, max(16 * self.max_body_bytes, 64 << 20)
        while more_body and received <= drain_limit:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            received += len(message.get("body", b""))
            more_body = message.get("more_body", False)
        message = (
            f"The request body is larger than the server's limit of {self.max_body_bytes} bytes "
            "(--max-request-body-bytes)."
        )
        await send_error(send, message, 413, code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await self._read_body(scope, receive, send)
        except TimeoutError:
            message = (
                f"The request body did not arrive within {self.body_timeout:g} s (--body-timeout); "
                "connection closed."
            )
            await send_error(send, message, 408, code="request_timeout", headers=[(b"connection", b"close")])
            return
        except _ClientLeft:
            return  # nobody is waiting for an answer
        if body is None:
            return  # answered with a 413

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, counting what actually arrives (chunked bodies, wrong Content-Length); None when it
        is over the limit (413 sent)."""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_body_bytes:
                    await self._reject(receive, send, more_body=True)
                    return None
                break
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientLeft
            chunk = message.get("body", b"")
            total += len(chunk)
            more = message.get("more_body", False)
            if total > self.max_body_bytes:
                await self._reject(receive, send, more_body=more)
                return None
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)
