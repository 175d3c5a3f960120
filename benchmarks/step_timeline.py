"""Sum up an engine step timeline (not a test): which steps make the slow inter-token gaps, and what they held.

    BRISK_STEP_TIMELINE=steps.jsonl brisk serve ...     # or LLM(...) offline; a line per engine step
    python benchmarks/step_timeline.py steps.jsonl [--slowest 10] [--json summary.json]

Counts only steps with decoding sequences (a stream waited through them), so that idle time between requests is
not read as a slow step. Prints the interval percentiles (what a stream sees between tokens), the mean interval
by the prompt tokens a step carried, the slowest steps, and how many full garbage collections fell into them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PREFILL_BUCKETS = ((0, 0), (1, 512), (513, 2048), (2049, 8192), (8193, 1 << 30))  # prompt tokens in a step


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))] if ordered else 0.0


def summarize(steps: list[dict], slowest: int = 10) -> dict:
    """The figures printed, as a dict (``--json``)."""
    decoding = [s for s in steps if s["decode_seqs"] > 0]
    intervals = [s["interval_ms"] for s in decoding]
    buckets = []
    for low, high in PREFILL_BUCKETS:
        members = [s for s in decoding if low <= s["prefill_tokens"] <= high]
        if members:
            buckets.append({
                "prefill_tokens": str(low) if low == high else f"{low}-{high}" if high < 1 << 30 else f">={low}",
                "steps": len(members),
                "mean_interval_ms": round(sum(s["interval_ms"] for s in members) / len(members), 3),
                "max_interval_ms": max(s["interval_ms"] for s in members),
            })  # fmt: skip
    worst = sorted(decoding, key=lambda s: s["interval_ms"], reverse=True)[:slowest]
    return {
        "steps": len(steps),
        "decoding_steps": len(decoding),
        "interval_ms": {f"p{q}": percentile(intervals, q) for q in (50, 90, 99)} | {"max": max(intervals, default=0)},
        "apply_ms_mean": round(sum(s["apply_ms"] for s in decoding) / max(len(decoding), 1), 3),
        "full_gc_in_decoding_steps": sum(s["full_gc"] for s in decoding),
        "by_prefill_tokens": buckets,
        "slowest": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = parser.parse_args()
    steps = [json.loads(line) for line in args.timeline.read_text().splitlines() if line.strip()]
    summary = summarize(steps, args.slowest)
    iv = summary["interval_ms"]
    print(f"{summary['steps']} steps, {summary['decoding_steps']} with decoding sequences; interval between "
          f"bookings p50 {iv['p50']:.1f} ms, p90 {iv['p90']:.1f}, p99 {iv['p99']:.1f}, max {iv['max']:.1f}; "
          f"booking {summary['apply_ms_mean']:.2f} ms a step; "
          f"{summary['full_gc_in_decoding_steps']} full GCs")  # fmt: skip
    print("by prompt tokens in the step:")
    for b in summary["by_prefill_tokens"]:
        print(f"  {b['prefill_tokens']:>12}: {b['steps']:6d} steps, mean {b['mean_interval_ms']:7.1f} ms, "
              f"max {b['max_interval_ms']:7.1f} ms")  # fmt: skip
    print(f"slowest {len(summary['slowest'])}:")
    for s in summary["slowest"]:
        print(f"  t={s['t']:9.3f} s  {s['interval_ms']:7.1f} ms  tokens {s['tokens']:6d} (prompt {s['prefill_tokens']} "
              f"in {s['prefill_seqs']} seqs, {s['decode_seqs']} decoding)  booking {s['apply_ms']:.1f} ms  "
              f"full GCs {s['full_gc']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
