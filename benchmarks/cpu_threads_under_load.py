"""CPU decode speed by torch thread count, on a quiet machine and beside processes that keep cores busy.

    python benchmarks/cpu_threads_under_load.py [--threads 1 2] [--busy 0 1] [--batch-sizes 1 8] [--json FILE]

OpenMP threads wait for each other at the end of every parallel region: when another process takes one of their
cores, each region lasts until the scheduler gives the descheduled thread its slice again, so a thread count that
is the fastest on a quiet machine can collapse on a busy one. This measures it: for each number of busy
processes (pure-Python loops, one core each) and each thread count, the embedded default model decodes
``--output-len`` tokens greedily at each batch size (best of ``--repeats``, after a warm-up), and prints tok/s.
``brisk serve``'s default thread count (``serve_cpu_threads``) comes from these figures (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk import LLM, SamplingParams  # noqa: E402


def spin() -> None:
    while True:
        pass


def decode_tok_s(llm: LLM, batch: int, output_len: int, repeats: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    prompts = [[100 + i, 200, 300, 400] for i in range(batch)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        best = min(best, time.perf_counter() - started)
    return batch * output_len / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--busy", type=int, nargs="+", default=[0, 1], help="busy processes beside the engine")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--output-len", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    llm = LLM(
        "smollm2-135m-instruct",
        device="cpu",
        kv_cache_memory_bytes=64 << 20,
        max_model_len=512,
        enable_prefix_caching=False,
    )
    rows = []
    for busy in args.busy:
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
        for p in spinners:
            p.start()
        try:
            for threads in args.threads:
                torch.set_num_threads(threads)
                for batch in args.batch_sizes:
                    tok_s = decode_tok_s(llm, batch, args.output_len, args.repeats)
                    rows.append({"busy": busy, "threads": threads, "batch": batch, "tok_s": round(tok_s, 1)})
                    print(f"busy {busy}  threads {threads}  batch {batch:3d}  {tok_s:8.1f} tok/s", flush=True)
        finally:
            for p in spinners:
                p.terminate()
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu_count": multiprocessing.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
