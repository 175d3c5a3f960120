"""Request body size limit as a pure ASGI middleware: a declared ``Content-Length`` over the limit, or a
(chunked) body that grows past it, gets 413 without the body ever being held in memory."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from brisk.entrypoints.openai.errors import send_error


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body_bytes = max_body_bytes

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
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > self.max_body_bytes:
                    await self._reject(receive, send, more_body=True)
                    return
                break

        # Count what actually arrives (chunked bodies, wrong Content-Length): read it up front, then replay.
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                chunks = []
                pending: Message | None = message  # a disconnect: let the app see it
                break
            chunk = message.get("body", b"")
            total += len(chunk)
            more = message.get("more_body", False)
            if total > self.max_body_bytes:
                await self._reject(receive, send, more_body=more)
                return
            chunks.append(chunk)
            if not more:
                pending = None
                break

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if pending is not None:
                    return pending
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
