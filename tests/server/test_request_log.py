"""vLLM's logging flags on a real server: ``--enable-log-requests`` logs each request's id, prompt length and
sampling parameters; by default nothing of a request is logged; ``--disable-log-stats`` is accepted (brisk logs
no periodic statistics)."""

from __future__ import annotations

from tests.server.conftest import MODEL_NAME, ServerProcess

BODY = {"model": MODEL_NAME, "prompt": "The quick brown fox", "max_tokens": 3, "temperature": 0}
LOGGED = "prompt tokens, SamplingParams("


def complete(server: ServerProcess) -> str:
    with server.client() as client:
        reply = client.post("/v1/completions", json=BODY)
    assert reply.status_code == 200, reply.text
    return reply.json()["id"]


def test_requests_are_logged_when_asked(tiny_model_dir):
    server = ServerProcess(tiny_model_dir, "--enable-log-requests", "--disable-log-stats")
    try:
        complete(server)
        lines = [line for line in server.logs().splitlines() if LOGGED in line]
        assert len(lines) == 1 and "max_tokens=3" in lines[0] and "temperature=0" in lines[0]
    finally:
        server.stop()


def test_nothing_of_a_request_is_logged_by_default(server):
    complete(server)
    assert LOGGED not in server.logs()
