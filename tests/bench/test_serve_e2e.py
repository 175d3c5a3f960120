"""`brisk bench serve` against a real `brisk serve` (the tiny llama with its tokenizer), text and token-id prompts."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from brisk.entrypoints.cli.main import main

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVE_CLI = REPO_ROOT / "brisk" / "entrypoints" / "cli" / "serve.py"

pytestmark = pytest.mark.skipif(
    not SERVE_CLI.is_file(), reason="brisk serve (brisk/entrypoints/cli/serve.py) is not in this checkout yet"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def brisk_server(tiny_llama, tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("serve-log") / "server.log"
    log = log_path.open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("BRISK_API_KEY", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "brisk.entrypoints.cli.main",
        "serve",
        tiny_llama,
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--kv-cache-memory-bytes",
        "16MiB",
        "--max-model-len",
        "512",
        "--disable-uvicorn-access-log",
    ]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"brisk serve exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"brisk serve not ready in 120 s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _bench(url, tmp_path, *extra):
    out = tmp_path / "serve.json"
    argv = [
        "bench",
        "serve",
        "--base-url",
        url,
        "--random-input-len",
        "24",
        "--random-output-len",
        "6",
        "--num-prompts",
        "6",
        "--max-concurrency",
        "3",
        "--output-json",
        str(out),
        *extra,
    ]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_serve_text_prompts(brisk_server, tiny_llama, tmp_path):
    data = _bench(brisk_server, tmp_path, "--model", "tiny", "--tokenizer", tiny_llama, "--random-prefix-len", "8")
    m = data["results"]["server"]
    assert data["config"]["prompt_format"] == "text"
    assert m["completed"] == 6 and m["failed"] == 0 and m["errors"] == []
    assert m["total_output_tokens"] == 36 and m["output_token_count_method"] == "usage"
    assert m["server_prompt_tokens"] is not None and m["server_prompt_tokens"] >= m["total_input_tokens"] - 6
    assert m["ttft_ms"]["mean"] > 0 and m["tpot_ms"]["count"] == 6 and m["e2el_ms"]["p99"] >= m["ttft_ms"]["p99"]
    assert m["itl_ms"]["count"] >= 1 and m["output_throughput"] > 0 and m["request_throughput"] > 0


def test_serve_token_id_prompts(brisk_server, tmp_path):
    # no --model: the first id of /v1/models; token-id prompts drawn from the tiny vocabulary
    data = _bench(brisk_server, tmp_path, "--random-vocab-size", "300", "--save-detailed", "--request-rate", "50")
    m = data["results"]["server"]
    assert data["config"]["model"] == "tiny" and data["config"]["prompt_format"] == "token-ids"
    assert m["completed"] == 6 and m["total_input_tokens"] == 6 * 24 == m["server_prompt_tokens"]
    assert m["total_output_tokens"] == 36 and len(m["detailed"]["ttft_s"]) == 6
