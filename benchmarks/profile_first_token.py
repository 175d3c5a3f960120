"""Where a request's time to first token goes (not a test): W3's prompt (128 ids, one output token) on the
Llama-3.1-8B shape with random weights, or any ``--model``; on a GPU or, for a smoke run, on the CPU.

    python benchmarks/profile_first_token.py [--prompt-len 128] [--repeats 10] [--model llama-tiny-shape]

W3's decode tok/s divides 256 tokens by the whole request, so its prefill counts too: the 1-token wall of W3 was
12 to 23 ms on H200 hosts of one day, against about 5 ms of weight reads and matrix products. This prints the
median time from ``add_request`` to the finished output, then profiles one such request with host and device
activities: the host's busy time in the engine step and in kernel launches, the device's kernel time, and the
launches per kind. A host-bound prefill shows host time close to the wall and device time well below it.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from brisk import SamplingParams
from brisk.bench.configs import materialize
from brisk.config import EngineArgs
from brisk.engine.engine import LLMEngine


def _first_token(engine: LLMEngine, request_id: str, prompt: list[int], params: SamplingParams) -> float:
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params, stream=False)
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b-shape", help="a named shape (dummy weights) or a folder")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    with materialize(args.model) as folder:
        engine = LLMEngine(EngineArgs(model=folder, load_format="dummy", max_model_len=4096))
    rng = np.random.default_rng(2)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    prompts = [rng.integers(0, 10000, args.prompt_len).tolist() for _ in range(args.repeats + 4)]
    for i in range(3):  # warm-up: compiles, allocator pools
        _first_token(engine, f"warm{i}", prompts[i], params)
    walls = [_first_token(engine, f"r{i}", prompts[3 + i], params) for i in range(args.repeats)]
    print(f"add_request to finished, {args.prompt_len}-token prompt, 1 token: median {np.median(walls) * 1e3:.2f} ms "
          f"(min {min(walls) * 1e3:.2f}, max {max(walls) * 1e3:.2f})")  # fmt: skip

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        wall = _first_token(engine, "profiled", prompts[-1], params)
    events = prof.events()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = [e for e in events if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx")]
    print(f"profiled request: {wall * 1e3:.2f} ms wall (the profiler adds host time)")
    print(f"host: {len(launches)} kernel launches, {sum(e.cpu_time_total for e in launches) / 1e3:.2f} ms inside the "
          f"launch calls")  # fmt: skip
    if kernels:
        busy_ms = sum(e.device_time_total for e in kernels) / 1e3
        print(f"device: {len(kernels)} kernels, {busy_ms:.2f} ms of kernel time")
        for name, count in Counter(e.name[:70] for e in kernels).most_common(12):
            print(f"  {count:5d}  {name}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=50))


if __name__ == "__main__":
    main()
