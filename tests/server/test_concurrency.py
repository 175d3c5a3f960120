"""200 concurrent short requests (streamed and not, completions and chat) all complete with the right text,
and the Prometheus counters account for exactly what was sent."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.server.conftest import MODEL_NAME

NUM_REQUESTS = 200
MAX_TOKENS = 8
PROMPTS = [f"Request number {i} says" for i in range(10)]


def _body(i: int) -> tuple[str, dict]:
    prompt = PROMPTS[i % len(PROMPTS)]
    stream = i % 2 == 1
    common = {
        "model": MODEL_NAME,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        common["stream_options"] = {"include_usage": True}
    if i % 4 < 2:
        return "/v1/completions", {**common, "prompt": prompt}
    return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}


async def _one(http: httpx.AsyncClient, sem: asyncio.Semaphore, i: int) -> tuple[int, str, dict]:
    path, body = _body(i)
    async with sem:
        if not body["stream"]:
            r = await http.post(path, json=body)
            assert r.status_code == 200, r.text
            data = r.json()
            choice = data["choices"][0]
            text = choice["text"] if "text" in choice else choice["message"]["content"]
            return i, text, data["usage"]
        text, usage, done = "", None, False
        async with http.stream("POST", path, json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line:
                    continue
                payload = line.removeprefix("data: ")
                if payload == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(payload)
                assert "error" not in chunk, chunk
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk["choices"]:
                    text += c.get("text") or (c.get("delta") or {}).get("content") or ""
        assert done and usage is not None
        return i, text, usage


async def _run_all(server) -> list[tuple[int, str, dict]]:
    sem = asyncio.Semaphore(64)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers, timeout=120, limits=limits
    ) as http:
        return await asyncio.gather(*(_one(http, sem, i) for i in range(NUM_REQUESTS)))


def test_200_concurrent_requests(server):
    # Reference texts, one request at a time (greedy, so the batched results must match).
    reference = {}
    with server.client() as http:
        for i in range(4):
            path, body = _body(i)
            for prompt in PROMPTS:
                b = {**body, "stream": False}
                b.pop("stream_options", None)
                if "prompt" in b:
                    b["prompt"] = prompt
                else:
                    b["messages"] = [{"role": "user", "content": prompt}]
                choice = http.post(path, json=b).json()["choices"][0]
                reference[(path, prompt)] = (
                    choice["text"] if "text" in choice else choice["message"]["content"]
                )

    before = server.metrics()
    results = asyncio.run(_run_all(server))
    after = server.metrics()

    assert len(results) == NUM_REQUESTS
    prompt_tokens = 0
    for i, text, usage in results:
        path, _ = _body(i)
        assert text == reference[(path, PROMPTS[i % len(PROMPTS)])], i
        assert usage["completion_tokens"] == MAX_TOKENS
        prompt_tokens += usage["prompt_tokens"]

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta('brisk:request_success_total{finished_reason="length"}') == NUM_REQUESTS
    assert delta('brisk:request_success_total{finished_reason="abort"}') == 0
    assert delta("brisk:generation_tokens_total") == NUM_REQUESTS * MAX_TOKENS
    assert delta("brisk:prompt_tokens_total") == prompt_tokens
    assert delta("brisk:time_to_first_token_seconds_count") == NUM_REQUESTS
    assert delta("brisk:e2e_request_latency_seconds_count") == NUM_REQUESTS
    assert delta("brisk:inter_token_latency_seconds_count") == NUM_REQUESTS * (MAX_TOKENS - 1)
    assert delta("brisk:request_queue_time_seconds_count") == NUM_REQUESTS
    # Ten distinct prompts, each sent 20 times: the prefix cache must have been hit.
    assert delta("brisk:prefix_cache_queries_total") > 0
    assert after["brisk:num_requests_running"] == 0
    # Continuous batching: fewer engine steps than tokens generated (one request at a time would need one step
    # per token). How many fewer depends on how fast the HTTP side admits requests: on a loaded 2-core machine
    # the engine often steps with only a few requests (about 2 tokens per step was seen), hence the margin.
    steps = delta("brisk:engine_steps_total")
    assert steps < NUM_REQUESTS * MAX_TOKENS * 3 / 4, f"{steps} steps for {NUM_REQUESTS * MAX_TOKENS} tokens"
