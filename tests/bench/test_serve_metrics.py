"""vLLM bench serve's metric definitions, on synthetic timings."""

import numpy as np
import pytest

from brisk.bench.serve_metrics import RequestResult, compute_metrics, summarize


def _req(ttft, gaps, out, prompt_len=10):
    return RequestResult(
        success=True, prompt_len=prompt_len, output_tokens=out, ttft=ttft, latency=ttft + sum(gaps), itl=list(gaps)
    )


def test_metric_math():
    a = _req(0.100, [0.010, 0.020, 0.030], out=4)  # E2EL 0.160, TPOT 0.060/3 = 20 ms
    b = _req(0.200, [0.040], out=2, prompt_len=30)  # E2EL 0.240, TPOT 40 ms
    c = _req(0.050, [], out=1)  # one token: no TPOT, no ITL
    failed = RequestResult(success=False, prompt_len=99, error="boom")
    m = compute_metrics([a, b, c, failed], duration_s=2.0, percentiles=[50, 90, 99])
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_input_tokens"] == 50 and m["total_output_tokens"] == 7
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["output_throughput"] == pytest.approx(3.5)
    assert m["total_token_throughput"] == pytest.approx(28.5)
    assert m["ttft_ms"]["mean"] == pytest.approx(1000 * 0.35 / 3, abs=1e-3)
    assert m["ttft_ms"]["median"] == pytest.approx(100.0)
    assert m["tpot_ms"]["count"] == 2 and m["tpot_ms"]["mean"] == pytest.approx(30.0)
    assert m["itl_ms"]["count"] == 4 and m["itl_ms"]["mean"] == pytest.approx(25.0)
    assert m["e2el_ms"]["p99"] == pytest.approx(np.percentile([160, 240, 50], 99), abs=1e-3)
    assert m["itl_ms"]["p90"] == pytest.approx(np.percentile([10, 20, 30, 40], 90), abs=1e-3)


def test_percentiles_are_linear_like_numpy():
    s = summarize([0.001 * i for i in range(1, 101)], [50, 90, 99, 99.9])
    assert s["p50"] == pytest.approx(50.5) and s["p90"] == pytest.approx(90.1) and s["p99"] == pytest.approx(99.01)
    assert "p99.9" in s


def test_empty_is_zero():
    m = compute_metrics([RequestResult(success=False)], duration_s=1.0)
    assert m["completed"] == 0 and m["ttft_ms"]["mean"] == 0.0 and m["tpot_ms"]["count"] == 0
    with pytest.raises(ValueError):
        compute_metrics([], duration_s=0)


def test_tpot_definition():
    r = _req(0.5, [0.1] * 9, out=10)
    assert r.tpot == pytest.approx((r.latency - r.ttft) / 9)
