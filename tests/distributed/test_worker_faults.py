"""A worker process that dies or hangs stops a tensor-parallel engine with an error naming its rank: offline
(``LLMEngine.step`` raises) and in ``brisk serve -tp 2`` (the request in flight ends with an error, ``/health``
turns 503). The server also answers the official ``openai`` client with the tokens of one rank."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from brisk import LLM, SamplingParams
from brisk.executor.multiproc import WorkerFailedError
from tests.server.conftest import MODEL_NAME, ServerProcess

LONG = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)


def _tp2(model: str) -> LLM:
    return LLM(model, device="cpu", tensor_parallel_size=2, max_model_len=256, kv_cache_memory_bytes=1 << 20)


def _step_until_error(llm: LLM) -> WorkerFailedError:
    with pytest.raises(WorkerFailedError) as exc:
        for _ in range(1000):
            llm.engine.step()
    return exc.value


def test_killed_worker_is_named(tiny_llama):
    llm = _tp2(tiny_llama)
    llm.engine.add_request("a", [5, 6, 7, 8], LONG)
    llm.engine.step()
    victim = llm.engine.model_runner._processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    error = _step_until_error(llm)
    assert f"worker rank 1 died during a step (pid {victim.pid}, exit code -9 (signal 9))" in str(error)
    with pytest.raises(WorkerFailedError, match="rank 1 died"):  # and it stays failed
        llm.engine.step()
    assert not any(p.is_alive() for p in llm.engine.model_runner._processes)


def test_hung_worker_is_named(tiny_llama):
    llm = _tp2(tiny_llama)
    llm.engine.model_runner.timeout_s = 3  # BRISK_WORKER_TIMEOUT_S, after a start-up that may take longer
    llm.engine.add_request("a", [5, 6, 7, 8], LONG)
    llm.engine.step()
    victim = llm.engine.model_runner._processes[1]
    os.kill(victim.pid, signal.SIGSTOP)
    try:
        error = _step_until_error(llm)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the executor has killed it already
            os.kill(victim.pid, signal.SIGCONT)
    assert "worker rank 1 did not take step" in str(error) and "within 3 s" in str(error)


def _children(pid: int) -> list[int]:
    """Child processes of ``pid``, leaving out multiprocessing's resource tracker."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"resource_tracker" not in cmdline:
            found.append(int(stat.parent.name))
    return sorted(found)


def test_serve_tp2(tiny_llama):
    prompt = "The quick brown fox"
    expected = LLM(tiny_llama, device="cpu", max_model_len=512).generate(
        prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False
    )[0]
    server = ServerProcess(tiny_llama, "--device", "cpu", "-tp", "2")
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0, timeout=60)
        r = client.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.choices[0].text == expected.outputs[0].text

        (engine_pid,) = _children(server.proc.pid)
        (forkserver_pid,) = _children(engine_pid)  # CPU workers are forked from a forkserver
        workers = _children(forkserver_pid)
        assert len(workers) == 2
        stream = client.completions.create(
            model=MODEL_NAME, prompt="Once upon", max_tokens=400, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        with pytest.raises(openai.APIError) as exc:
            for i, _ in enumerate(stream):
                if i == 2:
                    os.kill(workers[-1], signal.SIGKILL)
        assert f"pid {workers[-1]}" in str(exc.value) and "worker rank" in str(exc.value)
        deadline = time.monotonic() + 30
        while (status := httpx.get(f"{server.url}/health").status_code) == 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert status == 503
    finally:
        server.stop()
