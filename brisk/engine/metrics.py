"""Prometheus metrics of a serving engine (prefix ``brisk:``), on a registry of their own.

Names follow vLLM's (``vllm:`` -> ``brisk:``) so existing dashboards need only the prefix changed. Everything
is fed from one thread (in the server, ``AsyncLLM``'s reader of the engine process's messages):
:meth:`EngineMetrics.on_add` when a request is accepted, :meth:`on_outputs`
after each step, :meth:`on_abort` / :meth:`on_error` when a request ends early, :meth:`on_stats` with the
engine's :class:`EngineStats` (gauges, and deltas of its cumulative counters). prometheus-client objects are
thread-safe, so the HTTP thread can render them at any time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "EngineMetrics"]

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)  # fmt: skip

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass
class _Tracked:
    arrival: float
    prefilled: bool = False
    num_tokens: list[int] = field(default_factory=list)  # tokens generated so far, per completion
    last_token_time: float | None = None


class EngineMetrics:
    """The ``brisk:`` metrics of one engine, registered on ``registry`` (a fresh one by default)."""

    def __init__(self, model_name: str = "", registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        labels = ["model_name"]
        self._labels = {"model_name": model_name}
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(f"brisk:{name}", doc, labels, registry=r).labels(**self._labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(f"brisk:{name}", doc, labels, registry=r).labels(**self._labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(f"brisk:{name}", doc, labels, buckets=buckets, registry=r).labels(**self._labels)

        self.num_requests_running = gauge(
            "num_requests_running", "Requests being computed (running in the batch)."
        )
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1).")
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache (cumulative)."
        )
        self.prefix_cache_hits = counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache (cumulative)."
        )
        self.num_preemptions = counter("num_preemptions", "Requests preempted (and later recomputed).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed (counted at the first token).")
        self.generation_tokens = counter(
            "generation_tokens", "Tokens generated (all completions of a request)."
        )
        self.engine_steps = counter("engine_steps", "Engine steps run (one batch each).")
        self.spec_decode_num_drafts = counter(
            "spec_decode_num_drafts", "Speculative decoding: a request's steps that verified drafts."
        )
        self.spec_decode_num_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Speculative decoding: draft tokens proposed and verified."
        )
        self.spec_decode_num_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens accepted by the target."
        )
        self._request_success = Counter(
            "brisk:request_success",
            "Finished requests by finish reason (stop, length, abort, error; n>1: the first completion's).",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.request_success = {
            reason: self._request_success.labels(finished_reason=reason, **self._labels)
            for reason in FINISH_REASONS
        }
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Time from arrival to the first generated token.", _LATENCY_BUCKETS
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds",
            "Time between successive generated tokens of a request.",
            _ITL_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Time from arrival to the end of a request.", _E2E_BUCKETS
        )
        self.request_queue_time = histogram(
            "request_queue_time_seconds", "Time a request waited before it was first scheduled.", _E2E_BUCKETS
        )
        self.num_prompt_tokens_hist = histogram(
            "request_prompt_tokens", "Prompt length of finished requests.", _token_buckets()
        )
        self.num_generation_tokens_hist = histogram(
            "request_generation_tokens", "Generated tokens of finished requests.", _token_buckets()
        )
        self.engine_stalled = gauge(
            "engine_stalled",
            "1 while the engine is stalled (/health answers 503): requests are in flight and its process has "
            "sent no heartbeat within the stall timeout, or it has completed no step within the step timeout.",
        )
        self.engine_seconds_without_heartbeat = gauge(
            "engine_seconds_without_heartbeat",
            "Seconds without a message from the engine process while requests are in flight (0 while idle).",
        )
        self.engine_seconds_without_step = gauge(
            "engine_seconds_without_step",
            "Seconds since the engine last completed a step while requests are in flight (0 while idle).",
        )
        self._tracked: dict[str, _Tracked] = {}
        self._last_counters: dict[str, int] = {}

    def watch_heartbeat(self, engine: Any) -> None:
        """Read the heartbeat gauges from ``engine`` (an ``AsyncLLM``) at each scrape."""
        self.engine_stalled.set_function(lambda: float(engine.is_stalled))
        self.engine_seconds_without_heartbeat.set_function(lambda: engine.seconds_without_heartbeat)
        self.engine_seconds_without_step.set_function(lambda: engine.seconds_without_step)

    # ------------------------------------------------------------------------------------------
    # engine-thread hooks

    def on_add(self, request_id: str, arrival_time: float | None = None) -> None:
        self._tracked[request_id] = _Tracked(
            arrival=arrival_time if arrival_time is not None else time.time()
        )

    def on_outputs(self, outputs: list[Any], now: float | None = None) -> None:
        now = time.time() if now is None else now
        for out in outputs:
            t = self._tracked.get(out.request_id)
            if t is None:
                continue
            counts = [len(c.token_ids) for c in out.outputs]
            if len(t.num_tokens) < len(counts):
                t.num_tokens.extend([0] * (len(counts) - len(t.num_tokens)))
            new = [c - p for c, p in zip(counts, t.num_tokens, strict=True)]
            new_total = sum(n for n in new if n > 0)
            if new_total > 0:
                self.generation_tokens.inc(new_total)
                if not t.prefilled:
                    t.prefilled = True
                    self.prompt_tokens.inc(len(out.prompt_token_ids))
                    first = getattr(out.metrics, "first_token_time", None) or now
                    self.time_to_first_token.observe(max(first - t.arrival, 0.0))
                    scheduled = getattr(out.metrics, "first_scheduled_time", None)
                    if scheduled is not None:
                        self.request_queue_time.observe(max(scheduled - t.arrival, 0.0))
                elif t.last_token_time is not None:
                    step_tokens = max(max(new), 1)
                    gap = max(now - t.last_token_time, 0.0) / step_tokens
                    for _ in range(step_tokens):
                        self.inter_token_latency.observe(gap)
                t.last_token_time = now
                t.num_tokens = counts
            if out.finished:
                reason = (out.outputs[0].finish_reason if out.outputs else None) or "stop"
                self._finish(out.request_id, reason if reason in self.request_success else "stop", now, out)

    def on_abort(self, request_id: str) -> None:
        if request_id in self._tracked:
            self._finish(request_id, "abort", time.time(), None)

    def on_error(self, request_id: str) -> None:
        if request_id in self._tracked:
            self._finish(request_id, "error", time.time(), None)

    def on_stats(self, stats: Any) -> None:
        """Gauges from an ``EngineStats``; its cumulative counters are turned into increments."""
        self.num_requests_running.set(getattr(stats, "num_running", 0))
        self.num_requests_waiting.set(getattr(stats, "num_waiting", 0))
        self.kv_cache_usage.set(getattr(stats, "kv_cache_usage", 0.0))
        for name, metric in (
            ("prefix_cache_queries", self.prefix_cache_queries),
            ("prefix_cache_hits", self.prefix_cache_hits),
            ("num_preemptions", self.num_preemptions),
            ("spec_decode_num_drafts", self.spec_decode_num_drafts),
            ("spec_decode_num_draft_tokens", self.spec_decode_num_draft_tokens),
            ("spec_decode_num_accepted_tokens", self.spec_decode_num_accepted_tokens),
        ):
            value = getattr(stats, name, None)
            if value is None:
                continue
            last = self._last_counters.get(name, 0)
            if value > last:
                metric.inc(value - last)
            self._last_counters[name] = value

    # ------------------------------------------------------------------------------------------

    def _finish(self, request_id: str, reason: str, now: float, out: Any) -> None:
        t = self._tracked.pop(request_id, None)
        if t is None:
            return
        self.request_success[reason].inc()
        finished = getattr(getattr(out, "metrics", None), "finished_time", None) or now
        self.e2e_request_latency.observe(max(finished - t.arrival, 0.0))
        if out is not None:
            self.num_prompt_tokens_hist.observe(len(out.prompt_token_ids))
            self.num_generation_tokens_hist.observe(sum(len(c.token_ids) for c in out.outputs))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _token_buckets() -> tuple[float, ...]:
    buckets: list[float] = []
    scale = 1
    while scale <= 1_000_000:
        buckets.extend(float(m * scale) for m in (1, 2, 5))
        scale *= 10
    return tuple(buckets)
