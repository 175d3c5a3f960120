"""``brisk serve`` runs its engine in a child process: the child's logs reach the server's stderr, a killed
engine makes the server answer errors (never hang) and ``/health`` say so, a killed server takes its engine
along, and startup errors in the child are still one clear line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, descendants, engine_pid, running, started_together, wait_gone


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    with started_together(tiny_model_dir, (), ()) as (victim, orphan_maker):
        yield victim, orphan_maker


def test_engine_logs_reach_the_server_stderr(servers):
    victim, _ = servers
    logs = victim.logs()
    assert "INFO brisk.engine.engine: KV cache:" in logs  # logged in the engine process
    assert "Engine ready in" in logs
    assert engine_pid(victim) != victim.proc.pid


def test_killed_engine_process(servers):
    server, _ = servers
    pid = engine_pid(server)
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
    events, done = [], False
    started = time.monotonic()
    with (
        httpx.Client(base_url=server.url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
                if len(events) == 2:
                    os.kill(pid, signal.SIGKILL)
    assert done and time.monotonic() - started < 20
    assert len(events) < 400
    error = events[-1]["error"]
    assert error["message"] == "The engine process died unexpectedly (killed by SIGKILL); restart the server."

    r = httpx.get(f"{server.url}/health", timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
    assert r.status_code == 503 and "died" in r.json()["error"]["message"]
    metrics = server.metrics()
    assert metrics['brisk:request_success_total{finished_reason="error"}'] == 1
    assert metrics["brisk:num_requests_running"] == 0

    # The server itself still shuts down cleanly, and leaves nothing behind.
    left = descendants(server.proc.pid)
    assert not running(pid)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=30) == 0
    assert wait_gone(left) == []
    assert "The engine process died unexpectedly (killed by SIGKILL)" in server.logs()


def test_killed_server_takes_its_engine_along(servers):
    _, server = servers
    pid = engine_pid(server)
    left = descendants(server.proc.pid)
    server.proc.kill()
    server.proc.wait(timeout=10)
    # The engine process sees the end of its command pipe and exits by itself (no one is left to reap it, so
    # it may stay a zombie of the init process: it has exited all the same).
    assert wait_gone([pid, *left]) == []


def test_startup_errors_are_one_line(tiny_model_dir):
    """A bad model and a KV cache too small fail in the engine process; the server reports them as before: one
    ``brisk serve: error:`` line, no traceback, exit status 1, and nothing left running."""
    from tests.cli.conftest import cli_command, cli_env

    cases = {
        "/no/such/model": "brisk serve: error: Unknown model '/no/such/model'",
        f"{tiny_model_dir} --kv-cache-memory-bytes 1K": "brisk serve: error: The KV cache cannot hold one sequence",
    }
    # Run together (each spends seconds importing), each in a session of its own: whatever it starts (its engine
    # process) can be found by session id afterwards.
    procs = {
        flags: subprocess.Popen(
            cli_command("serve", *flags.split(), "--port", "0"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            start_new_session=True,
        )  # fmt: skip
        for flags in cases
    }
    for flags, proc in procs.items():
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 1, stderr
        assert "Traceback" not in stderr, stderr
        errors = [line for line in stderr.splitlines() if ": error: " in line]
        assert len(errors) == 1 and errors[0].startswith(cases[flags]), stderr
        # The error is the last line: nothing of it spills over onto more lines (the model's used to take 12).
        assert stderr.strip().splitlines()[-1] == errors[0], stderr
        assert wait_gone(in_session(proc.pid), 10) == []


def in_session(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:
                pass
    return pids
