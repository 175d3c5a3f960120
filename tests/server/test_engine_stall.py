"""A frozen engine (its process stopped with SIGSTOP) is noticed: with requests in flight and no heartbeat from
the engine process for --engine-stall-timeout seconds, /health answers 503 and the metrics say why; new requests
are refused with a 503 instead of waiting, requests already in flight end at --request-timeout, and all of it
clears once the engine runs again. A long step is not a stall; a step past --engine-step-timeout is."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

import httpx
import pytest

from tests.server.conftest import engine_pid, started_together

STALL_TIMEOUT = 3.0
REQUEST_TIMEOUT = 8.0
LONG = {"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    flags = ("--engine-stall-timeout", str(STALL_TIMEOUT), "--request-timeout", str(REQUEST_TIMEOUT))
    with started_together(tiny_model_dir, flags) as (server,):
        yield server


def test_frozen_engine_is_unhealthy_and_requests_end(server):
    pid = engine_pid(server)
    results: dict[str, object] = {}

    def non_streamed() -> None:
        results["plain"] = httpx.post(f"{server.url}/v1/completions", json=LONG, timeout=60)

    plain = threading.Thread(target=non_streamed)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            plain.start()
            time.sleep(0.2)
            os.kill(pid, signal.SIGSTOP)
            try:
                stopped = time.monotonic()
                while http.get("/health").status_code == 200:
                    assert time.monotonic() - stopped < STALL_TIMEOUT + 2, "/health stayed 200"
                    time.sleep(0.05)
                print(f"/health answered 503 {time.monotonic() - stopped:.2f} s after SIGSTOP")
                r = http.get("/health")
                assert r.status_code == 503 and "has not answered" in r.json()["error"]["message"], r.text
                metrics = server.metrics()
                assert metrics["brisk:engine_stalled"] == 1
                assert metrics["brisk:engine_seconds_without_heartbeat"] > STALL_TIMEOUT
                # New requests are refused at once rather than queued behind a frozen engine.
                r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
                assert r.headers["retry-after"] == "1"
                # Requests in flight end at the request timeout: the stream with an error event and [DONE].
                events = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
                assert events[-1] == "[DONE]"
                error = json.loads(events[-2])["error"]
                assert error["code"] == "request_timeout" and "request timeout" in error["message"], error
                plain.join(30)
                r = results["plain"]
                assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout", r.text
            finally:
                os.kill(pid, signal.SIGCONT)
        # Running again: the aborts are processed, the engine reports, and all is well.
        deadline = time.monotonic() + 20
        while http.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert server.metrics()["brisk:engine_stalled"] == 0
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200, r.text
    assert "Traceback" not in server.logs()


def test_idle_engine_is_never_stalled(server):
    """With nothing to do the engine reports nothing, and that is fine."""
    time.sleep(STALL_TIMEOUT + 0.5)
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_long_step_is_not_a_stall_but_a_stuck_loop_is(tiny_model_dir):
    """A step longer than the stall timeout keeps the heartbeat going (it is only long, like a big CPU
    prefill): not stalled. Past the step timeout the engine counts as stalled all the same (a stuck loop)."""
    from brisk.engine.async_engine import AsyncLLM
    from brisk.sampling_params import SamplingParams
    from tests.server.engines import FaultyEngine
    from tests.server.test_async_engine import engine_args

    step_s, stall_timeout, step_timeout = 7.0, 2.5, 4.5

    async def main() -> list[tuple[float, str | None]]:
        llm = AsyncLLM(
            engine_args(tiny_model_dir), engine_cls=FaultyEngine, stall_timeout_s=stall_timeout,
            step_timeout_s=step_timeout,
        )  # fmt: skip
        try:
            await llm.call_engine("arm", slow_next_step=step_s)
            request = asyncio.ensure_future(llm.add_request("slow", [5, 6, 7], SamplingParams(max_tokens=1)))
            started, samples = time.monotonic(), []
            while not request.done():
                samples.append((time.monotonic() - started, llm.stall_reason()))
                await asyncio.sleep(0.1)
            async for _ in request.result():
                pass
            assert not llm.is_stalled  # the step ended: progress again
            return samples
        finally:
            await llm.shutdown()

    samples = asyncio.run(main())
    assert samples[-1][0] > step_s - 1
    early = [reason for t, reason in samples if t < step_timeout - 0.3]
    late = [reason for t, reason in samples if step_timeout + 0.5 < t < step_s - 0.5]
    assert early and all(reason is None for reason in early), early
    assert late and all(reason and "completed no step" in reason for reason in late), late
