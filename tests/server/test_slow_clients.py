"""Slow and hostile clients cannot take the server offline: connections that never finish their headers are
timed out and, past --limit-concurrency, replaced by new ones; bodies that trickle in get a 408. The limits are
lowered through their flags so that each test takes seconds."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.server.conftest import ServerProcess, started_together

CAP = 20
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def guarded(tiny_model_dir):
    flags = ("--limit-concurrency", str(CAP), "--header-timeout", str(HEADER_TIMEOUT))
    flags += ("--body-timeout", str(BODY_TIMEOUT))
    with started_together(tiny_model_dir, flags) as (server,):
        yield server


def _open(server: ServerProcess, first_bytes: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(first_bytes)
    return sock


def _still_open(sock: socket.socket) -> bool:
    """Whether the server still holds the connection (no answer, no close)."""
    sock.setblocking(False)
    try:
        sock.recv(65536)  # an answer (408), or b"" (closed)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _held(socks: list[socket.socket]) -> int:
    return sum(_still_open(s) for s in socks)


def test_slowloris_over_the_cap_leaves_room_for_real_clients(guarded):
    """3 x CAP connections that never finish their headers: the server holds at most CAP of them, /health and a
    completion still answer within a second, and every slow connection is gone after the header timeout."""
    socks = [_open(guarded, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-") for _ in range(3 * CAP)]
    try:
        time.sleep(0.5)
        assert _held(socks) <= CAP
        with httpx.Client(base_url=guarded.url, timeout=5) as client:
            start = time.monotonic()
            assert client.get("/health").status_code == 200
            r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert time.monotonic() - start < 1.0
        time.sleep(HEADER_TIMEOUT + 1.0)
        assert _held(socks) == 0
    finally:
        for sock in socks:
            sock.close()


def test_header_timeout_answers_408(guarded):
    sock = _open(guarded, b"GET /health HTTP/1.1\r\nHost: x\r\n")
    try:
        sock.settimeout(HEADER_TIMEOUT + 3)
        start = time.monotonic()
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"--header-timeout" in answer
        assert HEADER_TIMEOUT - 0.5 < time.monotonic() - start < HEADER_TIMEOUT + 2
    finally:
        sock.close()


def test_slow_body_answers_408_and_closes(guarded):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    sock = _open(guarded, head + b'{"prompt": ')
    try:
        sock.settimeout(BODY_TIMEOUT + 3)
        answer = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code": "request_timeout"' in answer and b"--body-timeout" in answer
    finally:
        sock.close()
    assert "Traceback" not in guarded.logs()


def test_a_busy_server_answers_503_at_once(guarded):
    """Every connection busy with a request (bodies still arriving, so none can be replaced): a new connection
    gets the precomputed 503 with Retry-After instead of waiting."""
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    socks = [_open(guarded, head) for _ in range(CAP)]
    try:
        time.sleep(0.5)
        r = httpx.get(f"{guarded.url}/health", timeout=5)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert r.json()["error"]["code"] == "server_overloaded"
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"{guarded.url}/health", timeout=5).status_code == 200
