"""Profile one W1-like decode step on a GPU (not a test): 256 requests with ~820-token contexts on the
Llama-3.1-8B shape (random weights), the step's wall time, then the CUDA kernels of 5 steps by total time.

    python benchmarks/profile_decode_step.py [--requests 256] [--prompt-len 800] [--trace TRACE.json] \
        [--model llama-3.1-8b-shape-w4a16] [--quantization fp8]

``--model`` takes any of ``brisk bench``'s named shapes (the W4A16 one: 4-bit weights in groups of 128);
``--quantization fp8`` quantizes the weights while loading, as ``brisk bench --quantization fp8`` does.

``--trace`` also writes the kernels' Chrome trace and prints each kernel kind's share of the critical path:
how far each kernel moves the latest end time seen so far. Under programmatic dependent launch a kernel
starts before its predecessor ends, so its duration overstates its cost; the end-time increments do not
(their sum is the step's GPU time, gaps included).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from brisk import SamplingParams
from brisk.bench.configs import NAMED_CONFIGS
from brisk.config import EngineArgs
from brisk.engine.engine import LLMEngine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=800)
    parser.add_argument("--trace", help="write the profiled kernels as a Chrome trace here")
    parser.add_argument("--model", default="llama-3.1-8b-shape", choices=sorted(NAMED_CONFIGS))
    parser.add_argument("--quantization", default=None, help="e.g. fp8 (weights quantized while loading)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    with open(f"{folder}/config.json", "w") as f:
        json.dump(NAMED_CONFIGS[args.model], f)
    engine = LLMEngine(
        EngineArgs(model=folder, load_format="dummy", max_model_len=4096, quantization=args.quantization)
    )
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.6, max_tokens=400, ignore_eos=True, detokenize=False)
    for i in range(args.requests):
        engine.add_request(str(i), rng.integers(0, 10000, args.prompt_len).tolist(), params, stream=False)
    scheduler = engine.scheduler
    while scheduler.waiting or any(r.num_computed_tokens < r.num_tokens - 1 for r in scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        engine.step()
    torch.cuda.synchronize()
    print(f"decode step, batch {args.requests}: {(time.perf_counter() - start) / 20 * 1e3:.2f} ms wall")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            engine.step()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=16, max_name_column_width=50))
    if args.trace:
        prof.export_chrome_trace(args.trace)
        print_critical_path(args.trace, steps=5)


def print_critical_path(trace_path: str, steps: int) -> None:
    """Per kernel kind: launches per step, mean duration, and mean and per-step sum of end-time increments."""
    with open(trace_path) as f:
        kernels = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    kernels.sort(key=lambda e: e["ts"])
    kinds: dict[str, list[tuple[float, float]]] = defaultdict(list)
    latest_end = kernels[0]["ts"]
    for kernel in kernels:
        end = kernel["ts"] + kernel["dur"]
        kinds[kernel["name"][:60]].append((kernel["dur"], max(0.0, end - latest_end)))
        latest_end = max(latest_end, end)
    print(f"{'kernel':60} {'/step':>6} {'dur us':>8} {'incr us':>8} {'incr/step us':>13}")
    for name, rows in sorted(kinds.items(), key=lambda kv: -sum(r[1] for r in kv[1])):
        durations, increments = zip(*rows)
        print(f"{name:60} {len(rows) / steps:6.1f} {np.mean(durations):8.2f} {np.mean(increments):8.2f} "
              f"{sum(increments) / steps:13.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
