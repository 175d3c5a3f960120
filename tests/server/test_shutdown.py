"""SIGTERM: the server stops accepting, lets the stream in flight finish (or, past --shutdown-timeout, ends it
with an error event and [DONE]), stops its engine process, then exits 0 leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, ServerProcess, descendants, engine_pid, started_together, wait_gone


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    with started_together(
        tiny_model_dir, ("--shutdown-timeout", "60"), ("--shutdown-timeout", "1", "--max-num-seqs", "1"),
        ("--shutdown-timeout", "30"),
    ) as servers:
        yield servers


def _stream_through_sigterm(server: ServerProcess, body: dict) -> tuple[list[dict], bool]:
    events, done = [], False
    with (
        httpx.Client(base_url=server.url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
                break
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # No new connections once shutdown has begun.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/health", timeout=2)
        for line in lines:
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
    return events, done


def test_sigterm_lets_the_stream_finish(servers):
    patient, _, _ = servers
    children = descendants(patient.proc.pid)
    engine = engine_pid(patient)
    assert engine in children
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True}
    events, done = _stream_through_sigterm(patient, {**body, "temperature": 0, "stream": True})
    assert done
    assert "error" not in events[-1]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert patient.proc.wait(timeout=30) == 0
    assert "Traceback" not in patient.logs()
    # Nothing is left running; the engine process was even reaped (waited for) by the server before it exited.
    assert wait_gone(children, timeout=2) == []
    assert not os.path.exists(f"/proc/{engine}")


def test_sigterm_past_the_timeout_ends_the_stream_cleanly(servers):
    _, hasty, _ = servers
    children = descendants(hasty.proc.pid)
    # Far more work than one second even on an idle machine: 16 completions of 400 tokens, one at a time (the
    # server runs one sequence per step), so 6,400 steps.
    body = {"model": MODEL_NAME, "prompt": "Once", "max_tokens": 400, "n": 16, "ignore_eos": True}
    started = time.monotonic()
    events, done = _stream_through_sigterm(hasty, {**body, "stream": True})
    assert done
    assert events[-1]["error"]["message"] == "The engine was shut down before this request finished."
    assert hasty.proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 25
    logs = hasty.logs()
    assert "Shutdown timeout: ending the 1 requests still in flight" in logs
    assert "Traceback" not in logs
    assert wait_gone(children, timeout=2) == []


def test_sigterm_closes_half_sent_requests_at_once(servers):
    """Clients still sending their request body when SIGTERM comes are not waited for (that took the shutdown
    timeout + 5 s) nor answered with a 500 and a CancelledError traceback each: their connections close at
    once and the server exits."""
    _, _, server = servers
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{\"prompt\": "
    )
    socks = []
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.sendall(head)
        socks.append(sock)
    time.sleep(0.5)
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        for sock in socks:
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert b"500" not in answer.split(b"\r\n", 1)[0], answer
        assert server.proc.wait(timeout=20) == 0
    finally:
        for sock in socks:
            sock.close()
    assert time.monotonic() - started < 10  # the shutdown timeout is 30 s
    logs = server.logs()
    assert "Traceback" not in logs and "CancelledError" not in logs, logs
