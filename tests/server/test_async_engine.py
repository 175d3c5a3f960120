"""In-process tests of AsyncLLM and the app over a real ``LLMEngine`` on the tiny random-weight Llama (CPU):
outputs and metrics, rejected prompts, a full waiting queue (``QueueFullError`` / 503), aborts, shutdown with
requests in flight, the chunked body limit, and the engine-failure paths.

Every condition is produced by the real engine, with one exception each for the two conditions it cannot be
made to produce here, which ``FaultyEngine`` (a real ``LLMEngine`` subclass) injects:

* an exception from inside the engine: a ``step()`` whose model forward fails once (a CUDA error on a GPU),
  and a bug in ``add_request`` (a non-``ValueError``); a correct engine on CPU raises neither;
* a dead engine loop: an error outside ``step()``/``add_request`` (a bug in the loop itself), injected as
  ``has_unfinished_requests()`` raising.

After each scenario the engine must be idle with every KV block free: nothing leaks, however a request ends.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from brisk.config import EngineArgs
from brisk.engine.async_engine import AsyncLLM, EngineDeadError, EngineError, QueueFullError
from brisk.engine.engine import LLMEngine
from brisk.engine.metrics import EngineMetrics
from brisk.entrypoints.openai.config import ServerConfig
from brisk.entrypoints.openai.server import build_app
from brisk.sampling_params import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


def long_params() -> SamplingParams:
    """Runs for hundreds of steps unless aborted."""
    return SamplingParams(max_tokens=900, **GREEDY)


class FaultyEngine(LLMEngine):
    """A real engine with the two faults a correct engine cannot produce here, each armed by a flag."""

    fail_next_step = False  # the next step's model forward raises (after scheduling, like a CUDA error)
    fail_next_add = False  # the next add_request raises a TypeError (a bug, not the request's fault)
    die = False  # has_unfinished_requests() raises: the AsyncLLM loop itself breaks

    def step(self):
        if not self.fail_next_step:
            return super().step()
        self.fail_next_step = False

        def forward_fails(*args, **kwargs):
            raise RuntimeError("CUDA error: device-side assert (simulated)")

        self.model_runner.execute = forward_fails
        try:
            return super().step()
        finally:
            del self.model_runner.execute

    def add_request(self, *args, **kwargs):
        if self.fail_next_add:
            self.fail_next_add = False
            raise TypeError("add_request() got an unexpected keyword argument (simulated bug)")
        return super().add_request(*args, **kwargs)

    def has_unfinished_requests(self):
        if self.die:
            raise SystemError("the loop itself broke")
        return super().has_unfinished_requests()


@pytest.fixture
def make_engine(tiny_model_dir):
    def make(cls: type[LLMEngine] = LLMEngine, **kwargs) -> LLMEngine:
        return cls(EngineArgs(model=tiny_model_dir, device="cpu", kv_cache_memory_bytes=16 << 20, **kwargs))

    return make


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _collect(stream):
    return [o async for o in stream]


def assert_nothing_leaked(engine: LLMEngine) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks


async def wait_idle(llm: AsyncLLM, timeout_s: float = 10.0) -> None:
    """Wait until the engine thread has processed the aborts and the streams are delivered, then check leaks."""
    engine = llm.engine
    for _ in range(int(timeout_s / 0.01)):
        if not engine.has_unfinished_requests() and llm.num_in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert llm.num_in_flight == 0 and llm.num_waiting == 0
    assert_nothing_leaked(engine)


def test_generate_and_metrics(make_engine):
    async def main():
        engine = make_engine()
        metrics = EngineMetrics("tiny")
        llm = AsyncLLM(engine, metrics=metrics)
        llm.start()
        params = SamplingParams(max_tokens=4, **GREEDY)
        outs = [o async for o in llm.generate([1, 2, 3], params, "r1")]
        final = outs[-1]
        assert final.finished and len(final.outputs[0].token_ids) == 4
        assert final.outputs[0].finish_reason == "length"
        assert all(not o.finished for o in outs[:-1])
        assert llm.num_in_flight == 0 and llm.num_waiting == 0
        await llm.shutdown()
        assert_nothing_leaked(engine)
        text = metrics.render().decode()
        assert 'brisk:generation_tokens_total{model_name="tiny"} 4.0' in text
        assert 'brisk:prompt_tokens_total{model_name="tiny"} 3.0' in text
        assert 'brisk:request_success_total{finished_reason="length",model_name="tiny"} 1.0' in text
        return final

    final = run(main())
    # The same request on the same engine, stepped synchronously, gives the same tokens and text.
    engine = make_engine()
    engine.add_request("sync", [1, 2, 3], SamplingParams(max_tokens=4, **GREEDY))
    sync = []
    while engine.has_unfinished_requests():
        sync += engine.step()
    assert sync[-1].outputs[0].token_ids == final.outputs[0].token_ids
    assert sync[-1].outputs[0].text == final.outputs[0].text


def test_rejected_request_raises_value_error(make_engine):
    async def main():
        engine = make_engine(max_model_len=32)
        llm = AsyncLLM(engine)
        llm.start()
        with pytest.raises(ValueError, match="max_model_len is 32"):
            await llm.add_request("r", list(range(1, 33)), SamplingParams())
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await llm.add_request("v", [1, 10**6], SamplingParams())
        assert llm.num_in_flight == 0 and llm.num_waiting == 0 and llm.is_alive
        assert_nothing_leaked(engine)
        outs = await _collect(await llm.add_request("r", [1, 2], SamplingParams(max_tokens=2, **GREEDY)))
        assert outs[-1].finished  # the rejected id is free, and the engine serves on
        await llm.shutdown()
        assert_nothing_leaked(engine)

    run(main())


def test_queue_full(make_engine):
    async def main():
        engine = make_engine()
        llm = AsyncLLM(engine, max_waiting_requests=1)
        llm.start()
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
        assert engine.get_num_unfinished_requests() == 2
        streams[0].abort()
        second.abort()
        await wait_idle(llm)
        await llm.shutdown()

    run(main())


def test_abort_reaches_the_engine(make_engine):
    async def main():
        engine = make_engine()
        llm = AsyncLLM(engine)
        llm.start()
        stream = await llm.add_request("long", [1, 2, 3], long_params())
        async for _ in stream:
            break
        assert engine.has_unfinished_requests()
        assert engine.kv_cache_manager.num_free_blocks < engine.kv_cache_manager.pool.num_blocks
        stream.abort()
        await wait_idle(llm)
        assert llm.is_alive
        await llm.shutdown()

    run(main())


def test_step_exception_fails_in_flight_requests_only(make_engine):
    async def main():
        engine = make_engine(FaultyEngine)
        llm = AsyncLLM(engine)
        llm.start()
        engine.fail_next_step = True
        stream = await llm.add_request("x", [1, 2, 3], SamplingParams(max_tokens=3, **GREEDY))
        with pytest.raises(EngineError, match="device-side assert"):
            await _collect(stream)
        assert llm.is_alive
        await wait_idle(llm)  # the failed request was aborted in the engine: its blocks are free
        outs = await _collect(await llm.add_request("y", [1, 2, 3], SamplingParams(max_tokens=3, **GREEDY)))
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3
        await llm.shutdown()
        assert_nothing_leaked(engine)

    run(main())


def test_shutdown_ends_requests_in_flight(make_engine):
    async def main():
        engine = make_engine()
        llm = AsyncLLM(engine)
        llm.start()
        stream = await llm.add_request("x", [1, 2, 3], long_params())
        await llm.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            await _collect(stream)
        assert_nothing_leaked(engine)  # the engine thread aborted it before stopping
        assert not llm.is_alive
        with pytest.raises(EngineDeadError):
            await llm.add_request("z", [1], SamplingParams())

    run(main())


# ---- the app over a real engine, in process ----------------------------------------------------------------


def _app(engine, **config):
    config = ServerConfig(served_model_names=["tiny"], **config)
    llm = AsyncLLM(engine, max_waiting_requests=config.max_waiting_requests, metrics=EngineMetrics("tiny"))
    return llm, build_app(llm, config)


async def _client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30)


SHORT = {"prompt": "hi", "max_tokens": 3, "ignore_eos": True, "temperature": 0}


def test_app_engine_failure_is_a_500_then_recovers(make_engine):
    async def main():
        engine = make_engine(FaultyEngine)
        llm, app = _app(engine)
        llm.start()
        async with await _client(app) as http:
            engine.fail_next_step = True
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "server_error"
            assert "device-side assert" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
            assert (await http.get("/health")).status_code == 200
            # A bug in add_request: that request gets a 500 naming it, the next one is served.
            engine.fail_next_add = True
            r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 500 and "simulated bug" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 200
            # Failure in the middle of a stream: an error event, then [DONE].
            engine.fail_next_step = True
            r = await http.post("/v1/completions", json={**SHORT, "stream": True})
            assert r.status_code == 200
            events = [line for line in r.text.splitlines() if line.startswith("data: ")]
            assert '"error"' in events[-2] and events[-1] == "data: [DONE]"
            await wait_idle(llm)
        await llm.shutdown()
        assert_nothing_leaked(engine)

    run(main())


def test_app_queue_full_is_a_503(make_engine):
    async def main():
        # A small token budget: each 512-token prompt takes 128 chunked-prefill steps before its first token,
        # all that time counting as waiting, so the requests sent with it find the queue full.
        engine = make_engine(max_num_batched_tokens=4)
        llm, app = _app(engine, max_waiting_requests=1)
        llm.start()
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
                assert r.status_code == 503
                error = r.json()["error"]
                assert error["code"] == "server_overloaded" and "max-waiting-requests" in error["message"]
            pending = [t for t in tasks if not t.done()]
            while engine.get_num_unfinished_requests() < len(pending):  # the accepted ones reach the engine
                await asyncio.sleep(0.01)
            # The clients of the accepted (long) requests go away: their requests are aborted in the engine.
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await wait_idle(llm)
            r = await http.post("/v1/completions", json=SHORT)  # room again
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        await llm.shutdown()
        assert_nothing_leaked(engine)

    run(main())


def test_app_dead_engine_loop(make_engine):
    async def main():
        engine = make_engine(FaultyEngine)
        llm, app = _app(engine)
        llm.start()
        async with await _client(app) as http:
            assert (await http.get("/health")).status_code == 200
            engine.die = True
            llm.abort("nothing")  # wake the idle loop up so it notices
            for _ in range(100):
                if not llm.is_alive:
                    break
                await asyncio.sleep(0.01)
            r = await http.get("/health")
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
            r = await http.post("/v1/completions", json=SHORT)
            assert r.status_code == 503 and "died" in r.json()["error"]["message"]
        await llm.shutdown()
        engine.die = False
        assert_nothing_leaked(engine)

    run(main())


def test_body_limit_chunked(make_engine):
    async def main():
        engine = make_engine()
        llm, app = _app(engine, max_request_body_bytes=1000)
        llm.start()

        async def chunks():
            yield b'{"prompt": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        async with await _client(app) as http:
            r = await http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]
            assert not engine.has_unfinished_requests()  # the oversized body never reached the engine
            r = await http.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 1})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
        await llm.shutdown()
        assert_nothing_leaked(engine)

    run(main())
