"""`brisk bench serve --ready-timeout`: waits for a server that is up but not ready, gives up fast on one that is not
there. Real sockets and a real HTTP server on loopback; no mocks."""

import asyncio
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from brisk.bench.serve import wait_ready
from brisk.entrypoints.cli.main import main


def _bound_socket() -> socket.socket:
    """A loopback port that is bound but not listening: connecting to it is refused (as while brisk serve loads)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def _health_server(sock: socket.socket, not_ready_s: float, listen_after_s: float = 0.0):
    """Serve GET /health on ``sock``: 503 for ``not_ready_s`` seconds, then 200; start listening after a delay."""
    statuses: list[int] = []
    ready_at = time.monotonic() + listen_after_s + not_ready_s

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            status = 200 if time.monotonic() >= ready_at else 503
            statuses.append(status)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock

    def serve():
        time.sleep(listen_after_s)
        server.server_activate()  # listen(): from here on connections are accepted
        server.serve_forever(poll_interval=0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", statuses
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def test_refused_connections_fail_fast(capsys):
    sock = _bound_socket()  # held so that nothing else takes the port meanwhile
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    argv = ["bench", "serve", "--base-url", url, "--ready-timeout", "120", "--refused-timeout", "2"]
    argv += ["--num-prompts", "2", "--random-input-len", "8", "--random-output-len", "2", "--random-vocab-size", "100"]
    start = time.monotonic()
    try:
        assert main(argv) == 1
    finally:
        sock.close()
    elapsed = time.monotonic() - start
    assert 2 <= elapsed < 10
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("brisk bench: error: ")
    assert re.search(rf"{url} refused connections for [23] s in a row: no server listens there", err)
    assert "--refused-timeout" in err


def test_waits_for_an_accepting_server_that_is_not_ready():
    # 503 for 1.5 s, longer than the refused limit: answers are not refusals, so the wait goes on to the 200
    with _health_server(_bound_socket(), not_ready_s=1.5) as (url, statuses):
        asyncio.run(wait_ready(url, 20, {}, refused_timeout=0.5, poll_s=0.1))
    assert statuses[-1] == 200 and statuses.count(503) >= 5


def test_refusals_shorter_than_the_limit_are_waited_out():
    # bound but not listening for 1 s (a server loading its model), then 503 briefly, then ready
    with _health_server(_bound_socket(), not_ready_s=0.3, listen_after_s=1.0) as (url, statuses):
        asyncio.run(wait_ready(url, 20, {}, refused_timeout=3, poll_s=0.1))
    assert statuses[-1] == 200


def test_not_ready_within_the_ready_timeout():
    expected = pytest.raises(RuntimeError, match=r"/health did not answer 200 within 1 s")
    with _health_server(_bound_socket(), not_ready_s=60) as (url, statuses), expected:
        asyncio.run(wait_ready(url, 1, {}, refused_timeout=0.3, poll_s=0.1))
    assert set(statuses) == {503}


def test_exited_server_process_fails_at_once():
    sock = _bound_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # exits at once; left unreaped (a zombie) on purpose
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=rf"server process {proc.pid} exited before {url}/health answered"):
            asyncio.run(wait_ready(url, 60, {}, refused_timeout=0, server_pid=proc.pid, poll_s=0.1))
    finally:
        sock.close()
        proc.wait()
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--metric-percentiles", "50,150"], "numbers in [0, 100]"),
        (["--metric-percentiles", "50,p99"], "separated by commas"),
        (["--server-pid", "999999"], "add --ready-timeout"),
        (["--refused-timeout", "5"], "add --ready-timeout"),
        (["--tokenizer", "/does/not/exist"], "--tokenizer '/does/not/exist': no tokenizer could be loaded"),
    ],
)
def test_bad_client_flags_fail_before_any_request(flags, message, capsys):
    sock = _bound_socket()  # nothing listens: a request sent would fail differently
    argv = ["bench", "serve", "--base-url", f"http://127.0.0.1:{sock.getsockname()[1]}", "--num-prompts", "2"]
    try:
        assert main([*argv, *flags]) == 1
    finally:
        sock.close()
    err = capsys.readouterr().err.strip()
    assert err.startswith("brisk bench: error: ") and message in err and err.count("\n") == 0
