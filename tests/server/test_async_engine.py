"""In-process tests of AsyncLLM and the app over a real ``LLMEngine`` (in its engine process) on the tiny
random-weight Llama (CPU): outputs and metrics, rejected prompts, a full waiting queue (``QueueFullError`` /
503), aborts, shutdown with requests in flight, the chunked body limit, and the engine-failure paths.

Every condition is produced by the real engine, or by the real process: a killed engine process is a dead
engine. ``FaultyEngine`` (a real ``LLMEngine`` subclass in ``tests/server/engines.py``, built in the engine
process) injects the two conditions a correct engine cannot be made to produce here, armed through
``AsyncLLM.call_engine("arm", ...)``:

* an exception from inside the engine: a ``step()`` whose model forward fails once (a CUDA error on a GPU),
  and a bug in ``add_request`` (a non-``ValueError``); a correct engine on CPU raises neither;
* a broken engine loop: an error outside ``step()``/``add_request`` (a bug in the loop itself), injected as
  ``has_unfinished_requests()`` raising.

After each scenario the engine must be idle with every KV block free: nothing leaks, however a request ends.
The tests share one event loop and one engine process (starting one costs seconds); those that stop or kill
their engine start their own.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time

import httpx
import pytest

from brisk.config import EngineArgs
from brisk.engine.async_engine import AsyncLLM, EngineDeadError, EngineError, QueueFullError
from brisk.engine.engine import LLMEngine
from brisk.engine.metrics import EngineMetrics
from brisk.entrypoints.openai.config import ServerConfig
from brisk.entrypoints.openai.server import build_app
from brisk.sampling_params import SamplingParams
from tests.server.conftest import parse_metrics
from tests.server.engines import CheckedEngine, FaultyEngine

GREEDY = dict(temperature=0.0, ignore_eos=True)


def long_params() -> SamplingParams:
    """Runs for hundreds of steps unless aborted."""
    return SamplingParams(max_tokens=900, **GREEDY)


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def run(loop):
    def run(coro, timeout_s: float = 60):
        return loop.run_until_complete(asyncio.wait_for(coro, timeout_s))

    return run


def engine_args(model_dir: str, **kwargs) -> EngineArgs:
    return EngineArgs(model=model_dir, device="cpu", kv_cache_memory_bytes=16 << 20, **kwargs)


@pytest.fixture(scope="module")
def make_llm(tiny_model_dir, run):
    """``make(engine_cls, **engine_kwargs)``: a started AsyncLLM over its own engine process."""
    made: list[AsyncLLM] = []

    def make(engine_cls: type[LLMEngine] = CheckedEngine, *, metrics=None, **kwargs) -> AsyncLLM:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("OMP_NUM_THREADS", "1")  # the engine process's torch threads (tiny model: one is best)
            llm = AsyncLLM.from_engine_args(
                engine_args(tiny_model_dir, **kwargs), engine_cls=engine_cls, metrics=metrics
            )
        made.append(llm)

        async def start():
            llm.start()

        run(start())
        return llm

    yield make
    for llm in made:
        run(llm.shutdown())
        assert llm._proc.exitcode is not None


@pytest.fixture(scope="module")
def shared(make_llm):
    """The engine shared by the tests that leave it running and idle (a FaultyEngine, faults disarmed)."""
    return make_llm(FaultyEngine)


@pytest.fixture
def llm(shared, run):
    """The shared engine with fresh metrics and no waiting limit; it must be idle and leak-free after the test."""
    shared.metrics = EngineMetrics("tiny")
    shared.max_waiting_requests = None
    yield shared
    if shared.is_alive:
        run(wait_idle(shared))


async def _collect(stream):
    return [o async for o in stream]


def assert_nothing_leaked(report: dict[str, int]) -> None:
    assert report["unfinished"] == 0
    assert report["free_blocks"] == report["num_blocks"]


async def wait_idle(llm: AsyncLLM, timeout_s: float = 10.0) -> None:
    """Wait until the engine process has processed the aborts and the streams are delivered, then check leaks."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if llm.num_in_flight == 0 and (await llm.call_engine("leak_report"))["unfinished"] == 0:
            break
        await asyncio.sleep(0.01)
    assert llm.num_in_flight == 0 and llm.num_waiting == 0
    assert_nothing_leaked(await llm.call_engine("leak_report"))


def assert_stopped_idle(llm: AsyncLLM) -> None:
    """After shutdown: the engine's last stats show nothing running and every KV block free; its process has
    exited and was reaped."""
    stats = llm.last_stats
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0.0
    assert not llm.is_alive
    assert_process_gone(llm)


def assert_process_gone(llm: AsyncLLM) -> None:
    assert llm._proc.exitcode is not None
    assert llm._proc not in multiprocessing.active_children()
    assert not os.path.exists(f"/proc/{llm.engine_pid}"), "the engine process is still there (zombie?)"


def test_engine_process_froze_its_start_up_heap(llm):
    """The engine process put what start-up left (imports, model, kernels) out of the garbage collector's
    reach, so no full collection walks it between steps."""
    assert llm.engine_gc_frozen_objects > 50_000  # torch's and brisk's imports alone are ~237,000 objects


def test_generate_and_metrics(llm, run, tiny_model_dir):
    async def main():
        metrics = llm.metrics
        params = SamplingParams(max_tokens=4, **GREEDY)
        outs = [o async for o in llm.generate([1, 2, 3], params, "r1")]
        final = outs[-1]
        assert final.finished and len(final.outputs[0].token_ids) == 4
        assert final.outputs[0].finish_reason == "length"
        assert all(not o.finished for o in outs[:-1])
        # Outputs are cumulative, and each keeps its own token list.
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        assert lengths == sorted(set(lengths)) and lengths[-1] == 4
        assert final.prompt_token_ids == [1, 2, 3] and final.metrics.first_token_time is not None
        assert llm.num_in_flight == 0 and llm.num_waiting == 0
        await wait_idle(llm)
        text = metrics.render().decode()
        assert 'brisk:generation_tokens_total{model_name="tiny"} 4.0' in text
        assert 'brisk:prompt_tokens_total{model_name="tiny"} 3.0' in text
        assert 'brisk:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
        return final

    final = run(main())
    # The same request on the same engine, stepped synchronously here, gives the same tokens and text.
    engine = LLMEngine(engine_args(tiny_model_dir))
    engine.add_request("sync", [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY))
    sync = []
    while engine.has_unfinished_requests():
        sync += engine.step()
    assert sync[-1].outputs[0].token_ids == final.outputs[0].token_ids
    assert sync[-1].outputs[0].text == final.outputs[0].text


def test_text_prompt_n_logprobs_and_stop(llm, run, tiny_model_dir):
    """Outputs rebuilt from the engine process's deltas equal the engine's own (text prompt, n > 1, logprobs,
    prompt logprobs, a stop string)."""
    params = SamplingParams(max_tokens=12, n=2, seed=3, temperature=1.0, logprobs=2, prompt_logprobs=1, stop=["e"])

    async def main():
        return [o async for o in llm.generate("hello there", params, "t1")]

    outs = run(main())
    engine = LLMEngine(engine_args(tiny_model_dir))
    engine.add_request("sync", "hello there", params)
    sync = []
    while engine.has_unfinished_requests():
        sync += engine.step()
    got, want = outs[-1], sync[-1]
    assert got.prompt == "hello there" and got.prompt_token_ids == want.prompt_token_ids
    assert got.prompt_logprobs == want.prompt_logprobs
    assert len(got.outputs) == 2
    for g, w in zip(got.outputs, want.outputs, strict=True):
        assert (g.index, g.text, g.token_ids, g.finish_reason, g.stop_reason) == (
            w.index,
            w.text,
            w.token_ids,
            w.finish_reason,
            w.stop_reason,
        )
        assert g.logprobs == w.logprobs and g.cumulative_logprob == pytest.approx(w.cumulative_logprob)
    for earlier, later in zip(outs, outs[1:]):  # cumulative: every output extends the one before
        for a, b in zip(earlier.outputs, later.outputs, strict=True):
            assert b.text.startswith(a.text) and b.token_ids[: len(a.token_ids)] == a.token_ids


def test_rejected_request_raises_value_error(llm, run):
    async def main():
        n = llm.max_model_len
        with pytest.raises(ValueError, match=f"max_model_len is {n}"):
            await llm.add_request("r", [1] * n, SamplingParams())
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await llm.add_request("v", [1, 10**6], SamplingParams())
        assert llm.num_in_flight == 0 and llm.num_waiting == 0 and llm.is_alive
        assert_nothing_leaked(await llm.call_engine("leak_report"))
        outs = await _collect(await llm.add_request("r", [1, 2], SamplingParams(max_tokens=2, **GREEDY)))
        assert outs[-1].finished  # the rejected id is free, and the engine serves on

    run(main())


def test_queue_full(llm, run):
    async def main():
        llm.max_waiting_requests = 1
        # Sent at once: the first is accepted and waits for its first token, so the others find the queue full.
        results = await asyncio.gather(
            *(llm.add_request(f"r{i}", [1 + i, 2, 3], long_params()) for i in range(4)),
            return_exceptions=True,
        )
        streams = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, BaseException)]
        assert len(streams) == 1 and len(refused) == 3
        for exc in refused:
            assert isinstance(exc, QueueFullError) and "max-waiting-requests 1" in str(exc)
        # Once it produces tokens it is no longer waiting: there is room again, while it still runs.
        first = await streams[0].__anext__()
        assert not first.finished and llm.num_waiting == 0
        second = await llm.add_request("again", [4, 5, 6], long_params())
        assert not (await second.__anext__()).finished
        assert await llm.call_engine("get_num_unfinished_requests") == 2
        streams[0].abort()
        second.abort()
        await wait_idle(llm)

    run(main())


def test_abort_reaches_the_engine(llm, run):
    async def main():
        stream = await llm.add_request("long", [1, 2, 3], long_params())
        async for _ in stream:
            break
        report = await llm.call_engine("leak_report")
        assert report["unfinished"] == 1 and report["free_blocks"] < report["num_blocks"]
        stream.abort()
        await wait_idle(llm)
        assert llm.is_alive
        assert 'finished_reason="abort",model_name="tiny"} 1.0' in llm.metrics.render().decode()

    run(main())


def test_duplicate_request_id(llm, run):
    async def main():
        stream = await llm.add_request("dup", [1, 2, 3], long_params())
        with pytest.raises(ValueError, match="already in use"):
            await llm.add_request("dup", [1, 2, 3], long_params())
        stream.abort()
        await wait_idle(llm)

    run(main())


def test_call_engine_errors(llm, run):
    async def main():
        with pytest.raises(EngineError, match="AttributeError"):
            await llm.call_engine("no_such_method")
        with pytest.raises(EngineError, match="no fault named"):
            await llm.call_engine("arm", explode=True)
        # A command that cannot be pickled fails alone; the ones sent with it go through.
        results = await asyncio.gather(
            llm.call_engine("arm", die=lambda: True),
            llm.call_engine("get_num_unfinished_requests"),
            return_exceptions=True,
        )
        assert isinstance(results[0], EngineError) and "could not be sent to the engine" in str(results[0])
        assert results[1] == 0
        assert llm.is_alive

    run(main())


def test_step_exception_fails_in_flight_requests_only(llm, run):
    async def main():
        await llm.call_engine("arm", fail_next_step=True)
        stream = await llm.add_request("x", [1, 2, 3], SamplingParams(max_tokens=3, **GREEDY))
        with pytest.raises(EngineError, match="device-side assert"):
            await _collect(stream)
        assert llm.is_alive
        await wait_idle(llm)  # the failed request was aborted in the engine: its blocks are free
        outs = await _collect(await llm.add_request("y", [1, 2, 3], SamplingParams(max_tokens=3, **GREEDY)))
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
        assert 'finished_reason="error",model_name="tiny"} 1.0' in llm.metrics.render().decode()

    run(main())


def test_shutdown_ends_requests_in_flight(make_llm, run):
    llm = make_llm()

    async def main():
        stream = await llm.add_request("x", [1, 2, 3], long_params())
        await llm.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            await _collect(stream)
        assert_stopped_idle(llm)  # the engine aborted it before stopping, then exited
        assert llm._proc.exitcode == 0
        with pytest.raises(EngineDeadError, match="shutting down"):
            await llm.add_request("z", [1], SamplingParams())
        await llm.shutdown()  # twice is fine

    run(main())


def test_killed_engine_process(make_llm, run):
    """A real dead engine: the process is killed with a request in flight."""
    llm = make_llm(metrics=EngineMetrics("tiny"))

    async def main():
        stream = await llm.add_request("x", [1, 2, 3], long_params())
        await stream.__anext__()
        os.kill(llm.engine_pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError, match=r"died unexpectedly \(killed by SIGKILL\)"):
            await _collect(stream)
        assert not llm.is_alive and llm.num_in_flight == 0 and llm.num_waiting == 0
        with pytest.raises(EngineDeadError, match="died"):
            await llm.add_request("y", [1], SamplingParams())
        with pytest.raises(EngineDeadError):
            await llm.call_engine("leak_report")
        metrics = parse_metrics(llm.metrics.render().decode())
        assert metrics['brisk:request_success_total{finished_reason="error"}'] == 1
        assert metrics["brisk:num_requests_running"] == 0
        started = time.monotonic()
        await llm.shutdown()
        assert time.monotonic() - started < 2
        assert_process_gone(llm)

    run(main())


# ---- the app over a real engine, in process ----------------------------------------------------------------


def _app(llm, **config):
    config = ServerConfig(served_model_names=["tiny"], **config)
    llm.max_waiting_requests = config.max_waiting_requests
    return build_app(llm, config)


async def _client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30)


SHORT = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True, "temperature": 0}


def test_app_engine_failure_is_a_500_then_recovers(llm, run):
    app = _app(llm)

    async def main():
        async with await _client(app) as http:
            await llm.call_engine("arm", fail_next_step=True)
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "server_error"
            assert "device-side assert" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
            assert (await http.get("/health")).status_code == 200
            # A bug in add_request: that request gets a 500 naming it, the next one is served.
            await llm.call_engine("arm", fail_next_add=True)
            r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 500 and "simulated bug" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 200
            # Failure in the middle of a stream: an error event, then [DONE].
            await llm.call_engine("arm", fail_next_step=True)
            r = await http.post("/v1/completions", json={**SHORT, "stream": True})
            assert r.status_code == 200
            events = [line for line in r.text.splitlines() if line.startswith("data: ")]
            assert '"error"' in events[-2] and events[-1] == "data: [DONE]"
            await wait_idle(llm)

    run(main())


def test_app_queue_full_is_a_503(make_llm, run):
    # A small token budget: each 512-token prompt takes 128 chunked-prefill steps before its first token,
    # all that time counting as waiting, so the requests sent with it find the queue full.
    llm = make_llm(max_num_batched_tokens=4, metrics=EngineMetrics("tiny"))
    app = _app(llm, max_waiting_requests=1)

    async def main():
        async with await _client(app) as http:
            bodies = [
                {"prompt": [(7 * i + k) % 300 + 1 for k in range(512)], "max_tokens": 500, "ignore_eos": True}
                for i in range(4)
            ]
            tasks = [asyncio.ensure_future(http.post("/v1/completions", json=b)) for b in bodies]
            while sum(t.done() for t in tasks) + llm.num_in_flight < len(tasks):
                await asyncio.sleep(0.01)
            refused = [t.result() for t in tasks if t.done()]
            assert refused and llm.num_in_flight >= 1
            for r in refused:
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                error = r.json()["error"]
                assert error["code"] == "server_overloaded" and "max-waiting-requests" in error["message"]
            pending = [t for t in tasks if not t.done()]
            # The accepted requests reach the engine.
            while await llm.call_engine("get_num_unfinished_requests") < len(pending):
                await asyncio.sleep(0.01)
            # The clients of the accepted (long) requests go away: their requests are aborted in the engine.
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await wait_idle(llm)
            r = await http.post("/v1/completions", json=SHORT)  # room again
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        await wait_idle(llm)
        await llm.shutdown()
        assert_stopped_idle(llm)

    run(main())


def test_app_dead_engine_loop(make_llm, run):
    llm = make_llm(FaultyEngine, metrics=EngineMetrics("tiny"))
    app = _app(llm)

    async def main():
        async with await _client(app) as http:
            assert (await http.get("/health")).status_code == 200
            await llm.call_engine("arm", die=True)  # the loop breaks right after this call
            for _ in range(500):
                if not llm.is_alive:
                    break
                await asyncio.sleep(0.01)
            r = await http.get("/health")
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 503
            assert "The engine loop died (SystemError: the loop itself broke)" in r.json()["error"]["message"]
        await llm.shutdown()
        assert llm._proc.exitcode == 1
        assert_process_gone(llm)

    run(main())


def test_app_killed_engine_process(make_llm, run):
    """Killing the engine process mid-stream: the stream ends with an error event and [DONE] (no hang), the
    next request gets a 503 saying the engine died, /health answers 503."""
    llm = make_llm(metrics=EngineMetrics("tiny"))
    app = _app(llm)

    async def main():
        async with await _client(app) as http:
            assert (await http.get("/health")).status_code == 200
            body = {**SHORT, "max_tokens": 900, "stream": True}
            task = asyncio.ensure_future(http.post("/v1/completions", json=body))  # the whole stream, at its end
            while not llm.metrics.generation_tokens._value.get():  # it is running
                await asyncio.sleep(0.01)
            os.kill(llm.engine_pid, signal.SIGKILL)
            r = await task
            assert r.status_code == 200
            events = [line for line in r.text.splitlines() if line.startswith("data: ")]
            assert len(events) < 900
            assert "killed by SIGKILL" in events[-2] and '"error"' in events[-2] and events[-1] == "data: [DONE]"
            r = await http.get("/health")
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
            r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 503 and "died" in r.json()["error"]["message"]
        await llm.shutdown()
        assert_process_gone(llm)

    run(main())


def test_body_limit_chunked(llm, run):
    app = _app(llm, max_request_body_bytes=1000)

    async def main():
        async def chunks():
            yield b'{"prompt": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        async with await _client(app) as http:
            r = await http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]
            # The oversized body never reached the engine.
            assert (await llm.call_engine("leak_report"))["unfinished"] == 0
            r = await http.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 1})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1

    run(main())
