"""guidellm and aiperf, two unmodified third-party benchmark clients, against a real ``brisk serve``: a short
streaming run of each completes every request with none errored, as the tool's own result file reports.

Both ask for vLLM's ``stream_options.continuous_usage_stats`` (guidellm whenever it streams, aiperf with
``--per-chunk-usage``); brisk once answered that with a 400, and guidellm's streaming mode failed on every
request. The checks read the tools' reports rather than the server's: the point is that the tools themselves
see success and count the output tokens from the server's usage.

Each tool is installed from PyPI at a pinned version into a virtual environment of its own, outside the
repository, built once and reused across runs, and run through its console script as a user runs it. Neither
fits the dev environment: aiperf pins huggingface-hub<2, prometheus-client~=0.23 and rich~=14.1 (the dev
environment has newer ones); guidellm pins click~=8.4 and brings sanic, which wants multidict<7.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.server.conftest import MODEL_NAME, ServerProcess

GUIDELLM = "guidellm==0.8.1"
AIPERF = "aiperf==0.13.0"
REQUESTS = 6
PROMPT_TOKENS = 16
OUTPUT_TOKENS = 16
CONCURRENCY = 2
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "brisk-test-clients"


def tool_venv(name: str, requirements: list[str]) -> Path:
    """A virtual environment holding ``requirements``, in the cache, built on first use.

    A marker written after a successful install names what is in it, so a changed pin rebuilds it and a broken
    install is never reused; the lock keeps two test runs on one machine from building it at once.
    """
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    venv = CACHE_DIR / f"{name}-py{sys.version_info.major}{sys.version_info.minor}"
    marker = venv / "brisk-installed.txt"
    wanted = " ".join(requirements)
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == wanted:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run([*pip, *requirements], capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            pytest.fail(f"pip install {wanted} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        marker.write_text(wanted)
    return venv


def run_tool(argv: list[str], env: dict[str, str], timeout: float = 300) -> None:
    """Run a tool's CLI, with ``env`` added to this environment, to the end; fail with its output if it exits
    non-zero."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    full_env.update(HF_HUB_DISABLE_TELEMETRY="1", **env)
    done = subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout)
    output = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, f"{Path(argv[0]).name} exited with {done.returncode}:\n{output[-8000:]}"


@pytest.fixture(scope="module")
def guidellm_venv() -> Path:
    """guidellm requires torch: pinned to the dev environment's release, which pip takes from the local CPU
    wheel as scripts/install.sh does, never an unpinned multi-GB download."""
    return tool_venv(GUIDELLM.replace("==", "-"), [f"torch=={torch.__version__.split('+')[0]}", GUIDELLM])


@pytest.fixture(scope="module")
def aiperf_venv() -> Path:
    if sys.version_info < (3, 11):
        pytest.skip("aiperf requires Python 3.11 or newer")
    return tool_venv(AIPERF.replace("==", "-"), [AIPERF])


def test_guidellm_streaming_benchmark(server: ServerProcess, tiny_model_dir: str, guidellm_venv: Path, tmp_path):
    report = tmp_path / "guidellm.json"
    backend = f"kind=openai_http,target={server.url},model={MODEL_NAME},api_key={server.api_key},stream=true"
    run_tool(
        [
            str(guidellm_venv / "bin" / "guidellm"), "run",
            "--backend", backend,
            "--profile", f"kind=concurrent,streams={CONCURRENCY}",
            "--constraint", f"kind=max_requests,count={REQUESTS}",
            "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
            "--tokenizer", f"kind=huggingface_auto,model={tiny_model_dir}",
            "--output", f"kind=json,path={report}",
            "--disable-console",
        ],
        env={"HF_HUB_OFFLINE": "1"},  # the tokenizer is a local folder; there is no hub to ask
    )  # fmt: skip
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    metrics = benchmark["metrics"]
    # guidellm exits 0 when every request fails (as they all did on the 400): the counts are the test.
    assert metrics["request_totals"] == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    assert benchmark["requests"]["errored"] == [] and benchmark["requests"]["incomplete"] == []
    for request in benchmark["requests"]["successful"]:
        body = json.loads(request["request_args"])["body"]
        assert body["stream"] is True and body["stream_options"]["continuous_usage_stats"] is True
    assert metrics["output_token_count"]["successful"]["total_sum"] == REQUESTS * OUTPUT_TOKENS
    assert metrics["request_streaming_iterations_count"]["successful"]["min"] > 1  # tokens came in several chunks


def test_aiperf_streaming_profile(server: ServerProcess, tiny_model_dir: str, aiperf_venv: Path, tmp_path):
    artifacts = tmp_path / "aiperf"
    run_tool(
        [
            str(aiperf_venv / "bin" / "aiperf"), "profile",
            "--url", server.url, "--api-key", server.api_key, "--model", MODEL_NAME,
            "--endpoint-type", "chat", "--streaming",
            "--use-server-token-count", "--per-chunk-usage",  # output tokens from usage; continuous_usage_stats
            "--tokenizer", tiny_model_dir,
            "--request-count", str(REQUESTS), "--concurrency", str(CONCURRENCY),
            "--prompt-input-tokens-mean", str(PROMPT_TOKENS), "--prompt-input-tokens-stddev", "0",
            "--prompt-output-tokens-mean", str(OUTPUT_TOKENS), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true",
            "--no-server-metrics",  # brisk's /metrics wants the API key, which aiperf's scraper does not send
            "--no-gpu-telemetry", "--ui", "none",
            "--artifact-dir", str(artifacts),
        ],
        # Not HF_HUB_OFFLINE: aiperf 0.13 offline looks a tokenizer up only in the hub cache and rejects a folder
        # path, which it otherwise loads directly without asking the hub. Its dataset files go to the test's
        # folder rather than /tmp, where it leaves their directories behind.
        env={"AIPERF_DATASET_MMAP_BASE_PATH": str(tmp_path)},
    )  # fmt: skip
    summary: dict[str, Any] = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert summary["is_complete"] is True and summary["was_cancelled"] is False
    assert summary["request_count"]["avg"] == REQUESTS
    assert summary["error_summary"] == [] and summary.get("error_request_count", {"avg": 0})["avg"] == 0
    assert summary["request_error_rate"]["avg"] == 0
    assert summary["total_usage_completion_tokens"]["avg"] == REQUESTS * OUTPUT_TOKENS
    records = [json.loads(line) for line in (artifacts / "profile_export.jsonl").read_text().splitlines()]
    assert len(records) == REQUESTS
    for record in records:
        assert record.get("error") is None
        assert record["metrics"]["usage_completion_tokens"]["value"] == OUTPUT_TOKENS
        assert record["metrics"]["http_req_chunks_received"]["value"] > 1  # tokens came in several chunks
