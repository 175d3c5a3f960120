"""Connection-level limits that uvicorn lacks: a deadline for request headers and a cap on open connections.

uvicorn keeps a connection whose request headers never finish for as long as the client likes (its keep-alive
timeout starts only after a response), and its ``limit_concurrency`` answers 503 only once a request's headers
are complete. A client that opens connections and trickles header bytes (slowloris) therefore holds file
descriptors until the process runs out of them. :func:`guarded_protocol` returns uvicorn's httptools protocol
with two additions:

* **Header timeout**: a connection must complete its request headers within ``header_timeout`` seconds of
  opening (or of its previous response, on a kept-alive connection); otherwise it gets a 408 and is closed.
* **Connection cap**: beyond ``max_connections`` open connections, a new connection first evicts the connection
  that has been waiting longest for its request headers (a slow or idle client: a real one sends its headers
  within milliseconds); only when every connection is busy with a request does the newcomer get a 503, written
  before a single byte is parsed (precomputed bytes, then close).

The body of a request has its own deadline, enforced where it is read (``limits.BodySizeLimitMiddleware``).
At shutdown, connections that are still sending their request are closed at once rather than waited for.
"""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from brisk.entrypoints.openai.errors import OpenAIError, error_body


def _raw_response(status: int, message: str, code: str, extra_headers: str = "") -> bytes:
    """A whole HTTP/1.1 error response with an OpenAI-style body, as bytes written without any parsing."""
    body = error_body(OpenAIError(message, status_code=status, code=code).to_dict())
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra_headers}connection: close\r\n\r\n"
    )
    return head.encode() + body


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a connection cap (class attributes set by
    :func:`guarded_protocol`)."""

    max_connections: int | None = None
    header_timeout: float = 10.0
    # Connections waiting for request headers, oldest first (dicts keep insertion order); shared by the server's
    # connections, since the subclass is made per server.
    waiting_for_headers: dict[Any, float]
    timeout_response = b""
    busy_response = b""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._header_timer: Any = None
        cap = self.max_connections
        if cap is not None and len(self.connections) > cap and not self._evict_oldest_waiting():
            transport.write(self.busy_response)
            transport.close()
            return
        self._wait_for_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._headers_arrived()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # kept alive: the next request's headers have a deadline too
            self._wait_for_headers()

    def shutdown(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and cycle.more_body:
            # Still sending its request body: nobody will answer it; close now (the app sees a disconnect)
            # instead of waiting for the body, or for the shutdown deadline.
            self.transport.close()
            return
        super().shutdown()

    # ---- bookkeeping ------------------------------------------------------------------------------------
    def _wait_for_headers(self) -> None:
        self.waiting_for_headers.pop(self, None)
        self.waiting_for_headers[self] = time.monotonic()
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def _headers_arrived(self) -> None:
        self.waiting_for_headers.pop(self, None)
        if getattr(self, "_header_timer", None) is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self in self.waiting_for_headers and not self.transport.is_closing():
            self.waiting_for_headers.pop(self, None)
            self.transport.write(self.timeout_response)
            self.transport.close()

    def _evict_oldest_waiting(self) -> bool:
        for protocol in self.waiting_for_headers:
            if protocol is not self:
                protocol._headers_arrived()
                protocol.transport.close()
                return True
        return False


def guarded_protocol(max_connections: int | None, header_timeout: float) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` enforcing these limits (one class per server)."""
    timeout_message = (
        f"The request headers did not arrive within {header_timeout:g} s (--header-timeout); connection closed."
    )
    busy_message = (
        f"The server has {max_connections} open connections, all busy (--limit-concurrency). Retry later."
    )
    return type(
        "GuardedHttpToolsProtocol",
        (_GuardedProtocol,),
        {
            "max_connections": max_connections,
            "header_timeout": header_timeout,
            "waiting_for_headers": {},
            "timeout_response": _raw_response(408, timeout_message, "request_timeout"),
            "busy_response": _raw_response(
                503, busy_message, "server_overloaded", "retry-after: 1\r\n"
            ),
        },
    )
