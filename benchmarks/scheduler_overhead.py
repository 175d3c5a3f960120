"""Micro-benchmark (not a test): CPU cost of one scheduler step plus its KV-cache bookkeeping, with 256
requests decoding at once, prefix caching on. No model runs: sampled tokens are fixed.

    python benchmarks/scheduler_overhead.py [--requests 256] [--steps 2000]
"""

from __future__ import annotations

import argparse
import random
import time

from brisk.engine.kv_cache_manager import KVCacheManager
from brisk.engine.request import Request
from brisk.engine.scheduler import Scheduler
from brisk.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()

    rng = random.Random(0)
    max_len = args.prompt_len + args.steps + 64  # room for the tokens decoded while others prefill
    num_blocks = args.requests * (-(-max_len // args.block_size)) + 64
    kv = KVCacheManager(num_blocks, args.block_size, enable_caching=True)
    sched = Scheduler(kv, max_num_batched_tokens=8192, max_num_seqs=args.requests, max_model_len=max_len)
    params = SamplingParams(max_tokens=args.steps + 48, ignore_eos=True)
    for i in range(args.requests):
        prompt = [rng.randrange(32000) for _ in range(args.prompt_len)]
        sched.add_request(Request(str(i), prompt, params, frozenset()))
    # Prefill until every request decodes.
    while any(r.num_computed_tokens < r.num_tokens - 1 for r in sched.requests.values()) or sched.waiting:
        out = sched.schedule()
        sched.update_from_output(out, [1 if entry.sample else None for entry in out.scheduled])
    timings = []
    sampled = [rng.randrange(32000) for _ in range(args.requests)]
    for _ in range(args.steps):
        start = time.perf_counter()
        out = sched.schedule()
        sched.update_from_output(out, sampled)
        timings.append(time.perf_counter() - start)
    assert len(out.scheduled) == args.requests
    timings.sort()
    mean = sum(timings) / len(timings)
    print(
        f"{args.requests} decoding requests, {args.steps} steps: mean {mean * 1e3:.3f} ms/step, "
        f"p50 {timings[len(timings) // 2] * 1e3:.3f} ms, p99 {timings[int(len(timings) * 0.99)] * 1e3:.3f} ms"
    )


if __name__ == "__main__":
    main()
