"""A client that goes away aborts its request: running requests drop to 0 and the KV cache is freed."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import MODEL_NAME

RUNNING = "brisk:num_requests_running"
KV = "brisk:kv_cache_usage_perc"
ABORTED = 'brisk:request_success_total{finished_reason="abort"}'


def _wait_idle(server, idle_kv: float, timeout: float = 15.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m[RUNNING] == 0 and m["brisk:num_requests_waiting"] == 0 and m[KV] <= idle_kv + 1e-9:
            return m
        assert time.monotonic() < deadline, f"not idle after {timeout} s: {m}"
        time.sleep(0.1)


def _busy(server, timeout: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if m[RUNNING] > 0:
            return m
        assert time.monotonic() < deadline, "the request never ran"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 400}),
        ("/v1/responses", {"input": "Once upon a time", "max_output_tokens": 400}),
    ],
)
def test_stream_disconnect_aborts(server, path, fields):
    idle = _wait_idle(server, idle_kv=1.0)
    idle_kv = idle[KV]
    body = {"model": MODEL_NAME, **fields, "ignore_eos": True, "temperature": 0, "stream": True}
    with server.client() as http, http.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = 0
        for line in lines:
            if line.startswith("data: "):
                got += 1
                if got == 3:
                    break
        busy = _busy(server)
        assert busy[KV] > idle_kv
    # The connection is closed here, mid-stream.
    after = _wait_idle(server, idle_kv)
    assert after[ABORTED] == idle[ABORTED] + 1
    assert after["brisk:generation_tokens_total"] - idle["brisk:generation_tokens_total"] < 400


def test_non_streaming_disconnect_aborts(server):
    idle = _wait_idle(server, idle_kv=1.0)
    body = {
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "max_tokens": 400,
        "n": 8,
        "ignore_eos": True,
    }
    try:
        httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers, timeout=0.5)
    except httpx.TimeoutException:
        pass
    else:
        raise AssertionError("expected the request to outlive the client's timeout")
    after = _wait_idle(server, idle[KV])
    assert after[ABORTED] == idle[ABORTED] + 1
