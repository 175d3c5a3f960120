"""Profile one W1-like decode step on a GPU (not a test): 256 requests with ~820-token contexts on the
Llama-3.1-8B shape (random weights), the step's wall time, then the CUDA kernels of 5 steps by total time.

    python benchmarks/profile_decode_step.py [--requests 256] [--prompt-len 800]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from brisk import SamplingParams
from brisk.bench.configs import LLAMA31_8B_CONFIG
from brisk.config import EngineArgs
from brisk.engine.engine import LLMEngine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=800)
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    with open(f"{folder}/config.json", "w") as f:
        json.dump(LLAMA31_8B_CONFIG, f)
    engine = LLMEngine(EngineArgs(model=folder, load_format="dummy", max_model_len=4096))
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


if __name__ == "__main__":
    main()
