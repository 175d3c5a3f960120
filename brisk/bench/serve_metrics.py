"""vLLM ``bench serve``'s metric definitions, over per-request timings.

TTFT: request sent to first streamed chunk with choices. E2EL: request sent to the last such chunk.
TPOT per request: (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token.
ITL: the gaps between consecutive streamed chunks, over all requests. Throughputs divide by the benchmark's wall
time (first request sent to last request done); total throughput adds the prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass
class RequestResult:
    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # E2EL, seconds
    itl: list[float] = field(default_factory=list)  # seconds between consecutive chunks
    start_time: float = 0.0  # seconds since the benchmark started
    error: str = ""
    server_prompt_tokens: int | None = None  # usage.prompt_tokens, when the server reported it

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def _pkey(p: float) -> str:
    return f"p{int(p)}" if float(p).is_integer() else f"p{p:g}"


def summarize(values_s: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict:
    """mean / median / std / percentiles in milliseconds (0 for no values, as vLLM reports)."""
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=float) * 1000.0
    out = {"mean": float(np.mean(arr)), "median": float(np.median(arr)), "std": float(np.std(arr))}
    for p in percentiles:
        out[_pkey(p)] = float(np.percentile(arr, p))
    out["count"] = len(values_s)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def compute_metrics(
    results: Sequence[RequestResult], duration_s: float, percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict:
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}.")
    done = [r for r in results if r.success]
    total_input = sum(r.prompt_len for r in done)
    total_output = sum(r.output_tokens for r in done)
    ttfts = [r.ttft for r in done]
    tpots = [r.tpot for r in done if r.tpot is not None]
    itls = [gap for r in done for gap in r.itl]
    e2els = [r.latency for r in done]
    server_prompt = [r.server_prompt_tokens for r in done if r.server_prompt_tokens is not None]
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "duration_s": round(duration_s, 4),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "server_prompt_tokens": sum(server_prompt) if len(server_prompt) == len(done) and done else None,
        "request_throughput": round(len(done) / duration_s, 4),
        "output_throughput": round(total_output / duration_s, 3),
        "total_token_throughput": round((total_input + total_output) / duration_s, 3),
        "ttft_ms": summarize(ttfts, percentiles),
        "tpot_ms": summarize(tpots, percentiles),
        "itl_ms": summarize(itls, percentiles),
        "e2el_ms": summarize(e2els, percentiles),
    }
