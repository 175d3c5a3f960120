"""Where an engine's start-up goes (not a test): the engine's own phases and the Triton compiles it ran, on a fresh
Triton cache unless ``--warm``; on a GPU or, for a smoke run, on the CPU.

    python benchmarks/profile_startup.py [--model llama-3.1-8b-shape] [--warm] [--threads 1,4,16]

``--threads`` then compiles the same kernel specializations again, each time into another fresh cache, on that
many threads (``DeferredCompiles``, as the engine does before it runs a pass): how far Triton's compiles run in
parallel on this host.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b-shape", help="a named shape (dummy weights) or a folder")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--warm", action="store_true", help="keep the Triton cache (default: a fresh one)")
    parser.add_argument("--threads", default="", help="comma-separated thread counts to recompile everything with")
    args = parser.parse_args()
    if not args.warm:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")

    import torch
    import triton

    from brisk.bench.configs import materialize
    from brisk.config import EngineArgs
    from brisk.engine.engine import LLMEngine
    from brisk.worker.parallel_compiles import DeferredCompiles

    compiled: list[tuple[object, str]] = []  # (JITFunction, specialization data) of each compile, in order
    triton.knobs.runtime.jit_post_compile_hook = lambda *, fn, compile, **_: compiled.append(
        (fn.jit_function, compile["specialization_data"])
    )
    start = time.perf_counter()
    with materialize(args.model) as model:
        engine = LLMEngine(EngineArgs(model=model, load_format="dummy", device=args.device, seed=0))
    total = time.perf_counter() - start
    triton.knobs.runtime.jit_post_compile_hook = None
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in engine.startup_seconds.items())
    print(f"engine built in {total:.2f} s ({'warm' if args.warm else 'fresh'} Triton cache): {phases}")
    per_kernel = Counter(jit_function.fn.__qualname__ for jit_function, _ in compiled)
    print(f"{len(compiled)} Triton compiles (or loads from the cache on disk)")
    for name, count in per_kernel.most_common():
        print(f"  {name:40s} {count:4d}")

    device = torch.cuda.current_device() if engine.device.type == "cuda" else None
    for threads in [int(t) for t in args.threads.split(",") if t]:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"triton-{threads}-threads-")
        compiles = DeferredCompiles()
        for jit_function, spec in compiled:
            jit_function.device_caches[device][0].clear()
            compiles.add(jit_function, spec)
        start = time.perf_counter()
        compiles.compile_all(threads)
        print(f"the same {len(compiled)} compiles on {threads} threads: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
