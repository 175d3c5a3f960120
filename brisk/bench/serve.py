"""``brisk bench serve``: an async streaming client for any OpenAI-compatible ``/v1/completions`` (brisk, vLLM,
...), measuring as vLLM's ``bench serve`` does (see :mod:`brisk.bench.serve_metrics`).

Each request streams (``stream: true``, ``stream_options.include_usage``) with ``ignore_eos`` and a fixed
``max_tokens``; output tokens come from the final usage chunk, else from re-encoding the text with the tokenizer,
else from counting chunks. Requests are released all at once (``--request-rate inf``) or as a Poisson process
(gamma intervals with ``--burstiness``), and at most ``--max-concurrency`` are in flight.

The streams go through aiohttp (as vLLM's client does): its C HTTP parser keeps the client's own cost per chunk
low enough that hundreds of concurrent streams measure the server, not the client (httpx's pure-Python path
saturated one core near 256 streams on the H200's host, which inflated TTFT). Readiness checks use httpx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np

from brisk.bench import report
from brisk.bench.random_dataset import ServeRequest, random_requests
from brisk.bench.serve_metrics import DEFAULT_PERCENTILES, RequestResult, compute_metrics


async def send_request(
    session,
    url: str,
    headers: dict,
    model: str,
    request: ServeRequest,
    temperature: float,
    ignore_eos: bool,
    tokenizer=None,
    bench_start: float = 0.0,
) -> tuple[RequestResult, str]:
    """One streamed completion over an aiohttp ``session``; returns the timings and how its output tokens were
    counted."""
    import aiohttp

    payload = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.output_len,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    result = RequestResult(prompt_len=request.prompt_len)
    text_parts: list[str] = []
    chunks = 0
    usage_tokens = None
    first = True
    start = time.perf_counter()
    result.start_time = start - bench_start
    last = start
    try:
        async with session.post(url, json=payload, headers=headers) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                result.error = f"HTTP {response.status}: {body[:300]}"
                return result, "none"
            async for raw in response.content:  # one SSE line at a time
                line = raw.strip()
                if not line or line.startswith(b":"):
                    continue
                data_str = line.removeprefix(b"data:").strip()
                if data_str == b"[DONE]":
                    continue
                data = json.loads(data_str)
                if data.get("error"):
                    result.error = f"in-stream error: {json.dumps(data['error'])[:300]}"
                    return result, "none"
                if choices := data.get("choices"):
                    now = time.perf_counter()
                    if first:
                        result.ttft = now - start
                        first = False
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
                    text_parts.append(choices[0].get("text") or "")
                elif usage := data.get("usage"):
                    usage_tokens = usage.get("completion_tokens")
                    result.server_prompt_tokens = usage.get("prompt_tokens")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:  # ValueError: bad JSON, long line
        result.error = f"{type(exc).__name__}: {exc}"[:300]
        return result, "none"
    if first:
        result.error = "no chunk with choices was streamed (cannot time the first token)"
        return result, "none"
    result.latency = last - start
    result.success = True
    if usage_tokens:
        result.output_tokens, method = int(usage_tokens), "usage"
    elif tokenizer is not None:
        result.output_tokens = len(tokenizer.encode("".join(text_parts), add_special_tokens=False))
        method = "tokenizer"
    else:
        result.output_tokens, method = chunks, "chunks"
    return result, method


async def request_stream(
    requests: Sequence[ServeRequest], request_rate: float, burstiness: float, seed: int
) -> AsyncIterator[ServeRequest]:
    """Yield requests at ``request_rate`` per second (gamma-distributed gaps; burstiness 1 = Poisson), or at once."""
    rng = np.random.default_rng(seed)
    for i, request in enumerate(requests):
        yield request
        if request_rate == float("inf") or i == len(requests) - 1:
            continue
        await asyncio.sleep(rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness)))


DEFAULT_REFUSED_TIMEOUT = 60.0


def process_exited(pid: int) -> bool:
    """Whether process ``pid`` is gone: no such process, or one that exited and awaits its parent (a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # Linux: field 3 of /proc/PID/stat is the state, Z for a zombie
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


async def wait_ready(
    base_url: str,
    timeout: float,
    headers: dict,
    refused_timeout: float = DEFAULT_REFUSED_TIMEOUT,
    server_pid: int | None = None,
    poll_s: float = 1.0,
) -> None:
    """Poll ``GET /health`` until it answers 200, for at most ``timeout`` seconds.

    A server that accepts connections but is not ready (any other status, a slow answer) is waited for the whole
    ``timeout``. Refused connections (nothing listening: not started yet, still loading, or dead) end the wait
    once they have lasted ``refused_timeout`` seconds in a row (0: never early); ``server_pid`` ends it as soon as
    that process has exited. Each way out is a one-line :class:`RuntimeError`.
    """
    import httpx

    start = time.monotonic()
    deadline = start + timeout
    refused_since = None
    async with httpx.AsyncClient(timeout=5.0) as client:
        while True:
            try:
                if (await client.get(f"{base_url}/health", headers=headers)).status_code == 200:
                    return
                refused_since = None
            except httpx.ConnectError:  # refused (or no route, or no such host): nothing accepted the connection
                now = time.monotonic()
                refused_since = now if refused_since is None else refused_since
                if refused_timeout and now - refused_since >= refused_timeout:
                    raise RuntimeError(
                        f"{base_url} refused connections for {now - refused_since:.0f} s in a row: no server "
                        f"listens there (did it exit at start? see its log). A server that loads for longer "
                        f"needs a larger --refused-timeout (now {refused_timeout:g} s)."
                    ) from None
            except httpx.HTTPError:  # accepted, but no answer in time: still starting
                refused_since = None
            if server_pid is not None and process_exited(server_pid):
                raise RuntimeError(
                    f"the server process {server_pid} exited before {base_url}/health answered 200 (see its log)."
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{base_url}/health did not answer 200 within {timeout:g} s.")
            await asyncio.sleep(poll_s)


async def served_model(base_url: str, headers: dict) -> str:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30.0) as client:
            response = await client.get(f"{base_url}/v1/models", headers=headers)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"GET {base_url}/v1/models failed: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise RuntimeError(f"GET {base_url}/v1/models answered {response.status_code}; pass --model.")
    return response.json()["data"][0]["id"]


async def benchmark(
    requests: Sequence[ServeRequest],
    base_url: str,
    endpoint: str,
    model: str,
    headers: dict,
    max_concurrency: int | None,
    request_rate: float,
    burstiness: float,
    seed: int,
    temperature: float,
    ignore_eos: bool,
    tokenizer=None,
    initial_test: bool = True,
    timeout_s: float = 6 * 3600,
) -> tuple[list[RequestResult], float, list[str]]:
    """Run every request; returns (results in request order, wall seconds, token-count method per request)."""
    import aiohttp

    url = base_url.rstrip("/") + endpoint
    connector = aiohttp.TCPConnector(limit=0)  # no pool limit: --max-concurrency is the only bound
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=60.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        if initial_test:  # like vLLM: the first request once, untimed, to fail fast on a bad setup
            test, _ = await send_request(client, url, headers, model, requests[0], temperature, ignore_eos, tokenizer)
            if not test.success:
                raise RuntimeError(f"The initial test request failed: {test.error}")
        semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        bench_start = time.perf_counter()

        async def limited(request: ServeRequest):
            if semaphore is None:
                return await send_request(
                    client, url, headers, model, request, temperature, ignore_eos, tokenizer, bench_start
                )
            async with semaphore:
                return await send_request(
                    client, url, headers, model, request, temperature, ignore_eos, tokenizer, bench_start
                )

        tasks = []
        async for request in request_stream(requests, request_rate, burstiness, seed):
            tasks.append(asyncio.create_task(limited(request)))
        outcomes = await asyncio.gather(*tasks)
        duration = time.perf_counter() - bench_start
    return [o[0] for o in outcomes], duration, [o[1] for o in outcomes]


def load_tokenizer(path: str | None):
    if not path:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {path!r}: no tokenizer could be loaded from it ({exc}).") from exc


def parse_percentiles(text: str) -> list[float]:
    """``--metric-percentiles`` ("50,90,99"): numbers in [0, 100]."""
    try:
        percentiles = [float(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--metric-percentiles must be numbers separated by commas, got {text!r}.") from None
    if not percentiles or not all(0 <= p <= 100 for p in percentiles):
        raise ValueError(f"--metric-percentiles must be numbers in [0, 100], got {text!r}.")
    return percentiles


def run(args: argparse.Namespace) -> int:
    percentiles = parse_percentiles(args.metric_percentiles)
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1.")
    if args.request_rate <= 0 or args.burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be positive.")
    if not args.ready_timeout and (args.server_pid is not None or args.refused_timeout is not None):
        raise ValueError("--server-pid and --refused-timeout apply while waiting for readiness: add --ready-timeout.")
    refused_timeout = DEFAULT_REFUSED_TIMEOUT if args.refused_timeout is None else args.refused_timeout
    if args.ready_timeout < 0 or refused_timeout < 0:
        raise ValueError("--ready-timeout and --refused-timeout must be >= 0.")
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY") or None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base_url = args.base_url.rstrip("/")
    tokenizer = load_tokenizer(args.tokenizer)
    fmt = args.prompt_format
    if fmt == "auto":
        fmt = "text" if tokenizer is not None else "token-ids"
    if fmt == "text" and tokenizer is None:
        raise ValueError("--prompt-format text needs --tokenizer (random ids are decoded into text with it).")
    requests = random_requests(
        args.num_prompts,
        args.random_input_len,
        args.random_output_len,
        args.random_prefix_len,
        args.random_range_ratio,
        args.seed,
        tokenizer=tokenizer,
        as_token_ids=fmt == "token-ids",
        vocab_size=args.random_vocab_size,
    )
    if args.ready_timeout:
        asyncio.run(wait_ready(base_url, args.ready_timeout, headers, refused_timeout, args.server_pid))
    model = args.model or asyncio.run(served_model(base_url, headers))
    print(
        f"brisk bench serve: {len(requests)} requests to {base_url}{args.endpoint} ({model}), "
        f"max concurrency {args.max_concurrency or 'unlimited'}, request rate {args.request_rate}",
        flush=True,
    )
    results, duration, methods = asyncio.run(
        benchmark(
            requests,
            base_url,
            args.endpoint,
            model,
            headers,
            args.max_concurrency,
            args.request_rate,
            args.burstiness,
            args.seed,
            args.temperature,
            not args.no_ignore_eos,
            tokenizer,
            initial_test=not args.skip_initial_test,
        )
    )
    metrics = compute_metrics(results, duration, percentiles)
    counted = sorted({m for m, r in zip(methods, results) if r.success})
    metrics["output_token_count_method"] = ",".join(counted) or None
    metrics["expected_output_tokens"] = sum(r.output_len for r in requests)
    errors = sorted({r.error for r in results if not r.success})
    metrics["errors"] = errors[:10]
    if args.save_detailed:
        metrics["detailed"] = {
            "prompt_len": [r.prompt_len for r in results],
            "output_tokens": [r.output_tokens for r in results],
            "ttft_s": [r.ttft for r in results],
            "e2el_s": [r.latency for r in results],
            "start_s": [r.start_time for r in results],
            "itl_s": [r.itl for r in results],
            "errors": [r.error for r in results],
        }
    config = {
        "base_url": base_url,
        "endpoint": args.endpoint,
        "model": model,
        "dataset": "random",
        "prompt_format": fmt,
        "tokenizer": args.tokenizer,
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_prefix_len": args.random_prefix_len,
        "random_range_ratio": args.random_range_ratio,
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate,
        "burstiness": args.burstiness,
        "temperature": args.temperature,
        "ignore_eos": not args.no_ignore_eos,
        "seed": args.seed,
        "percentiles": percentiles,
    }
    env = report.environment()
    env["client_device_name"] = "n/a (the server's device is not visible to the client)"
    data = report.make_report("serve", args, config, {"server": metrics}, env, workload={"name": args.label})
    print_table(data)
    report.write_json(data, args.output_json)
    return 0 if metrics["failed"] == 0 else 1


def print_table(data: dict) -> None:
    m = data["results"]["server"]
    c = data["config"]
    print(
        f"\n{data['workload']['name'] or 'serve'}: {m['completed']} ok, {m['failed']} failed "
        f"in {m['duration_s']:.2f} s; "
        f"input {c['random_prefix_len']}+{c['random_input_len']}, output {c['random_output_len']}, "
        f"concurrency {c['max_concurrency'] or 'unlimited'}"
    )
    print(
        f"request throughput {m['request_throughput']:.2f} req/s, output {m['output_throughput']:,.1f} tok/s, "
        f"total {m['total_token_throughput']:,.1f} tok/s ({m['total_output_tokens']:,} output tokens, counted "
        f"from {m['output_token_count_method']})"
    )
    pkeys = [k for k in m["ttft_ms"] if k.startswith("p")]
    rows = [
        [name.upper(), *(m[f"{name}_ms"][k] for k in ("mean", "median", *pkeys))]
        for name in ("ttft", "tpot", "itl", "e2el")
    ]
    print(report.table(["ms", "mean", "median", *pkeys], rows))
    for err in m["errors"]:
        print(f"error: {err}")


DEFAULT_METRIC_PERCENTILES = ",".join(f"{p:g}" for p in DEFAULT_PERCENTILES)
