"""Per-step cost of handing the scheduled batch to worker processes, at batch 256 decode.

    python benchmarks/step_message_overhead.py [--batch 256] [--prompt-len 500] [--steps 400] [--json FILE]

With tensor or pipeline parallelism the scheduler runs once, on the driver, and every step its output crosses to
each rank: the driver encodes a ``StepMessage`` (``executor/step_sync.py``) and pickles it, the rank unpickles it
and its ``RequestMirror`` turns it back into a ``SchedulerOutput``. This times those four parts on the host, for
``--batch`` requests decoding one token a step (each step one new output token per request, a new KV block every
16 tokens), the shape of W1/W5 at high concurrency. The pipe itself is left out (a few microseconds for a few KB).
Prints the median and p90 of each part in milliseconds, and the message size.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk.engine.request import Request  # noqa: E402
from brisk.engine.scheduler import ScheduledRequest, SchedulerOutput  # noqa: E402
from brisk.executor.step_sync import RequestMirror, StepEncoder  # noqa: E402
from brisk.sampling_params import SamplingParams  # noqa: E402

VOCAB_SIZE = 128256  # Llama 3's (the width of a grammar's bitmask; no request here has one)

BLOCK_SIZE = 16


def decode_steps(batch: int, prompt_len: int, steps: int):
    """``steps`` SchedulerOutputs of ``batch`` requests that prefilled ``prompt_len`` tokens, then decode one
    token a step (the first output is the admission of every request, as one prefill step)."""
    params = SamplingParams(temperature=0.6, max_tokens=steps + 1, ignore_eos=True)
    requests = [Request(f"r{i}", list(range(prompt_len)), params, frozenset({0})) for i in range(batch)]
    tables = {
        r.request_id: list(range(i * 100, i * 100 + prompt_len // BLOCK_SIZE + 1)) for i, r in enumerate(requests)
    }
    yield SchedulerOutput(
        [ScheduledRequest(r, prompt_len, 0, True) for r in requests], tables, batch * prompt_len
    )  # fmt: skip
    for step in range(steps):
        for i, r in enumerate(requests):
            r.append_output_token(1000 + step)
            length = prompt_len + step + 1
            if length % BLOCK_SIZE == 0:
                tables[r.request_id].append(10**6 + i * 1000 + step)
        yield SchedulerOutput(
            [ScheduledRequest(r, 1, prompt_len + step, True) for r in requests], tables, batch
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=500)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    encoder, mirror = StepEncoder(VOCAB_SIZE), RequestMirror()
    parts: dict[str, list[float]] = {"encode": [], "pickle": [], "unpickle": [], "apply": []}
    sizes = []
    for i, schedule in enumerate(decode_steps(args.batch, args.prompt_len, args.steps)):
        t0 = time.perf_counter()
        message = encoder.encode(schedule)
        t1 = time.perf_counter()
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        t2 = time.perf_counter()
        received = pickle.loads(data)
        t3 = time.perf_counter()
        mirror.apply(received)
        t4 = time.perf_counter()
        if i == 0:  # the admission step, not a decode step
            continue
        for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[name].append(seconds * 1e3)
        sizes.append(len(data))
    totals = [sum(step) for step in zip(*parts.values())]
    summary = {name: {"median_ms": statistics.median(v), "p90_ms": sorted(v)[int(0.9 * len(v))]}
               for name, v in {**parts, "total": totals}.items()}  # fmt: skip
    for name, s in summary.items():
        print(f"{name:9s} median {s['median_ms']:.3f} ms   p90 {s['p90_ms']:.3f} ms")
    print(f"message   median {statistics.median(sizes) / 1024:.1f} KiB")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "parts": summary, "bytes": statistics.median(sizes)})
        )


if __name__ == "__main__":
    main()
