"""A real ``brisk serve`` subprocess on a free loopback port, serving the tiny random-weight Llama.

Starting a server costs ~10 s on 2 CPU cores (torch + transformers imports, model load), so one server with an
API key is shared by the whole session (every client sends the key); tests that kill their server start their
own.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key-0123456789"
MODEL_NAME = "tiny-llama"
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        model: str,
        *extra: str,
        api_key: str | None = API_KEY,
        startup_timeout: float = 120.0,
        wait: bool = True,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        fd, log_path = tempfile.mkstemp(prefix="brisk-serve-", suffix=".log")
        os.close(fd)
        self.log_path = Path(log_path)
        args = [
            sys.executable,
            "-m",
            "brisk.entrypoints.cli.main",
            "serve",
            model,
            "--port",
            str(self.port),
            "--served-model-name",
            MODEL_NAME,
            "--kv-cache-memory-bytes",
            "16MiB",
            "--max-model-len",
            "512",
            "--max-tokens-limit",
            "400",
            "--disable-uvicorn-access-log",
            *extra,
        ]
        if api_key:
            args += ["--api-key", api_key]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        env.pop("BRISK_API_KEY", None)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        with open(self.log_path, "w") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        if wait:
            self.wait_ready(startup_timeout)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def logs(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"brisk serve exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        logs = self.logs()
        self.stop()
        raise RuntimeError(f"brisk serve was not ready within {timeout} s:\n{logs}")

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60.0, **kwargs)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10).text
        return parse_metrics(text)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Stop the server and delete its log (set BRISK_KEEP_SERVER_LOGS=1 to keep it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not os.environ.get("BRISK_KEEP_SERVER_LOGS"):
            self.log_path.unlink(missing_ok=True)
        return self.proc.returncode


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


@contextlib.contextmanager
def started_together(model_dir: str, *args_per_server: tuple[str, ...]) -> Iterator[list[ServerProcess]]:
    """Servers without an API key, started at once (startup is mostly imports and loading, so they overlap
    well), ready when entered and killed on exit."""
    servers = [ServerProcess(model_dir, *args, api_key=None, wait=False) for args in args_per_server]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop(signal.SIGKILL)


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, with the ``model_name`` label dropped (one model per server)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        labels = re.sub(r'model_name="[^"]*",?', "", labels or "").replace(",}", "}")
        key = name if labels in ("", "{}") else f"{name}{labels}"
        out[key] = float(value)
    return out


# ---- processes (Linux /proc): the server's engine process, and what is left after it exits --------------------


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    children, out, todo = _children_by_parent(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def running(pid: int) -> bool:
    """The process exists and has not exited (a zombie has exited: only its parent's wait() is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def engine_pid(server: ServerProcess) -> int:
    """The pid of the server's engine process (started by multiprocessing's spawn)."""
    (pid,) = [p for p in descendants(server.proc.pid) if "spawn_main" in cmdline(p)]
    return pid


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if running(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if running(p)]


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    """The shared server (API key required)."""
    proc = ServerProcess(tiny_model_dir)
    yield proc
    proc.stop()
