"""In-process tests of AsyncLLM and the app's failure paths, on a scripted fake engine (no model): a full
waiting queue answers 503, an engine exception fails only the requests in flight (500, then the server serves
again), a dead engine loop turns /health to 503, aborts reach the engine, shutdown ends what is in flight."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from brisk.engine.async_engine import AsyncLLM, EngineDeadError, EngineError, QueueFullError
from brisk.engine.metrics import EngineMetrics
from brisk.entrypoints.openai.config import ServerConfig
from brisk.entrypoints.openai.server import build_app
from brisk.outputs import CompletionOutput, RequestMetrics, RequestOutput
from brisk.sampling_params import SamplingParams


class FakeEngine:
    """Emits token ``100 + k`` at step k of each request; text is one letter per token."""

    def __init__(self, tokenizer=None, max_model_len: int = 64):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.requests: dict[str, dict] = {}
        self.aborted: list[str] = []
        self.fail_next_step = False
        self.fail_next_add = False
        self.die = False
        self.gate = threading.Event()  # while clear, steps compute nothing (like a long prefill)
        self.gate.set()
        self.num_preemptions = 0

    def add_request(self, request_id, prompt, params, arrival_time=None):
        if self.fail_next_add:
            self.fail_next_add = False
            raise TypeError("add_request() got an unexpected keyword argument (simulated bug)")
        if len(prompt) >= self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens is too long")
        self.requests[request_id] = {
            "prompt": list(prompt),
            "params": params,
            "tokens": [],
            "arrival": arrival_time,
        }

    def abort_request(self, request_ids):
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            if self.requests.pop(rid, None) is not None:
                self.aborted.append(rid)

    def has_unfinished_requests(self):
        if self.die:
            raise SystemError("the loop itself broke")
        return bool(self.requests)

    def step(self):
        if not self.gate.is_set():
            time.sleep(0.005)
            return []
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("CUDA error: device-side assert (simulated)")
        outputs, now = [], time.time()
        for rid, r in list(self.requests.items()):
            r["tokens"].append(100 + len(r["tokens"]))
            done = len(r["tokens"]) >= r["params"].max_tokens
            text = "".join(chr(ord("a") + (t - 100) % 26) for t in r["tokens"])
            out = CompletionOutput(0, text, list(r["tokens"]), finish_reason="length" if done else None)
            metrics = RequestMetrics(r["arrival"], first_scheduled_time=r["arrival"], first_token_time=now)
            outputs.append(RequestOutput(rid, None, r["prompt"], [out], done, metrics))
            if done:
                del self.requests[rid]
        return outputs

    def get_stats(self):
        return SimpleNamespace(
            num_running=len(self.requests),
            num_waiting=0,
            kv_cache_usage=0.01 * len(self.requests),
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=self.num_preemptions,
        )


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _collect(stream):
    return [o async for o in stream]


def test_generate_and_metrics():
    async def main():
        metrics = EngineMetrics("fake")
        llm = AsyncLLM(FakeEngine(), metrics=metrics)
        llm.start()
        outs = [o async for o in llm.generate([1, 2, 3], SamplingParams(max_tokens=4), "r1")]
        assert [len(o.outputs[0].token_ids) for o in outs][-1] == 4 and outs[-1].finished
        assert outs[-1].outputs[0].text == "abcd"
        assert llm.num_in_flight == 0 and llm.num_waiting == 0
        await llm.shutdown()
        text = metrics.render().decode()
        assert 'brisk:generation_tokens_total{model_name="fake"} 4.0' in text
        assert 'brisk:prompt_tokens_total{model_name="fake"} 3.0' in text
        assert 'brisk:request_success_total{finished_reason="length",model_name="fake"} 1.0' in text

    run(main())


def test_rejected_request_raises_value_error():
    async def main():
        llm = AsyncLLM(FakeEngine(max_model_len=4))
        llm.start()
        with pytest.raises(ValueError, match="too long"):
            await llm.add_request("r", [1, 2, 3, 4, 5], SamplingParams())
        assert llm.num_in_flight == 0 and llm.num_waiting == 0 and llm.is_alive
        await llm.shutdown()

    run(main())


def test_queue_full():
    async def main():
        engine = FakeEngine()
        engine.gate.clear()  # nothing produces a token: everything stays waiting
        llm = AsyncLLM(engine, max_waiting_requests=2)
        llm.start()
        s1 = await llm.add_request("a", [1], SamplingParams(max_tokens=2))
        s2 = await llm.add_request("b", [1], SamplingParams(max_tokens=2))
        with pytest.raises(QueueFullError, match="max-waiting-requests"):
            await llm.add_request("c", [1], SamplingParams(max_tokens=2))
        engine.gate.set()
        await _collect(s1)
        await _collect(s2)
        s3 = await llm.add_request("c", [1], SamplingParams(max_tokens=2))  # room again
        await _collect(s3)
        await llm.shutdown()

    run(main())


def test_abort_reaches_the_engine():
    async def main():
        engine = FakeEngine()
        llm = AsyncLLM(engine)
        llm.start()
        stream = await llm.add_request("long", [1], SamplingParams(max_tokens=10_000))
        async for _ in stream:
            break
        stream.abort()
        for _ in range(100):
            if engine.aborted:
                break
            await asyncio.sleep(0.01)
        assert engine.aborted == ["long"] and not engine.requests
        await asyncio.sleep(0.05)
        assert llm.num_in_flight == 0
        await llm.shutdown()

    run(main())


def test_step_exception_fails_in_flight_requests_only():
    async def main():
        engine = FakeEngine()
        engine.fail_next_step = True
        llm = AsyncLLM(engine)
        llm.start()
        stream = await llm.add_request("x", [1], SamplingParams(max_tokens=3))
        with pytest.raises(EngineError, match="device-side assert"):
            await _collect(stream)
        assert llm.is_alive
        outs = await _collect(await llm.add_request("y", [1], SamplingParams(max_tokens=3)))
        assert outs[-1].finished
        await llm.shutdown()

    run(main())


def test_shutdown_ends_requests_in_flight():
    async def main():
        engine = FakeEngine()
        engine.gate.clear()  # the request never finishes by itself
        llm = AsyncLLM(engine)
        llm.start()
        stream = await llm.add_request("x", [1], SamplingParams(max_tokens=3))
        await llm.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            await _collect(stream)
        assert engine.aborted == ["x"]
        with pytest.raises(EngineDeadError):
            await llm.add_request("z", [1], SamplingParams())

    run(main())


# ---- the app over a fake engine, in process ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _app(engine, **config):
    config = ServerConfig(served_model_names=["fake"], **config)
    llm = AsyncLLM(engine, max_waiting_requests=config.max_waiting_requests, metrics=EngineMetrics("fake"))
    return llm, build_app(llm, config)


async def _client(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=10)


def test_app_engine_failure_is_a_500_then_recovers(tokenizer):
    async def main():
        engine = FakeEngine(tokenizer)
        llm, app = _app(engine)
        llm.start()
        async with await _client(app) as http:
            engine.fail_next_step = True
            r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "server_error"
            assert "device-side assert" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "abc"
            assert (await http.get("/health")).status_code == 200
            # A bug in add_request: that request gets a 500 naming it, the next one is served.
            engine.fail_next_add = True
            r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 500 and "simulated bug" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3})
            assert r.status_code == 200
            # Failure in the middle of a stream: an error event, then [DONE].
            engine.fail_next_step = True
            r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": True})
            assert r.status_code == 200
            events = [line for line in r.text.splitlines() if line.startswith("data: ")]
            assert '"error"' in events[-2] and events[-1] == "data: [DONE]"
        await llm.shutdown()

    run(main())


def test_app_queue_full_is_a_503(tokenizer):
    async def main():
        engine = FakeEngine(tokenizer)
        engine.gate.clear()
        llm, app = _app(engine, max_waiting_requests=1)
        llm.start()
        async with await _client(app) as http:
            first = asyncio.ensure_future(
                http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            )
            while llm.num_waiting < 1:
                await asyncio.sleep(0.01)
            r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503
            error = r.json()["error"]
            assert error["code"] == "server_overloaded" and "max-waiting-requests" in error["message"]
            engine.gate.set()
            assert (await first).status_code == 200
        await llm.shutdown()

    run(main())


def test_app_dead_engine_loop(tokenizer):
    async def main():
        engine = FakeEngine(tokenizer)
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
            r = await http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503 and "died" in r.json()["error"]["message"]
        await llm.shutdown()

    run(main())


def test_body_limit_chunked(tokenizer):
    async def main():
        llm, app = _app(FakeEngine(tokenizer), max_request_body_bytes=1000)
        llm.start()

        async def chunks():
            yield b'{"prompt": "'
            for _ in range(20):
                yield b"x" * 100
            yield b'"}'

        async with await _client(app) as http:
            r = await http.post(
                "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]
            r = await http.post("/v1/completions", json={"prompt": "x" * 10, "max_tokens": 1})
            assert r.status_code == 200
        await llm.shutdown()

    run(main())
