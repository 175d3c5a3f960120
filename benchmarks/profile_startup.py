"""Where an engine's start-up goes (not a test): the engine's own phases, and every Triton compile (kernel,
seconds), on a fresh Triton cache unless ``--warm``; on a GPU or, for a smoke run, on the CPU.

    python benchmarks/profile_startup.py [--model llama-3.1-8b-shape] [--warm] [--threads 16]

``--threads N`` then compiles the same kernels again, into another fresh cache, through ``JITFunction.preload``
in a pool of N threads (Triton's ``AsyncCompileMode``): how far Triton's compiles run in parallel on this host.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field


@dataclass
class CompileLog:
    """Triton's JIT hooks fill this: each compile's kernel, specialization and seconds, in order."""

    records: list[tuple[object, str, float]] = field(default_factory=list)  # (JITFunction, specialization, s)
    _pending: tuple[object, str, float] | None = None

    def before(self, *, fn, compile, **_) -> None:
        self._pending = (fn.jit_function, compile["specialization_data"], time.perf_counter())
        return None  # compile as usual

    def after(self, **_) -> None:
        jit_function, spec, start = self._pending
        self.records.append((jit_function, spec, time.perf_counter() - start))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b-shape", help="a named shape (dummy weights) or a folder")
    parser.add_argument("--device", default=None)
    parser.add_argument("--warm", action="store_true", help="keep the Triton cache (default: a fresh one)")
    parser.add_argument("--threads", type=int, default=0, help="then recompile everything in N threads")
    args = parser.parse_args()
    if not args.warm:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")

    import torch
    import triton
    from triton.runtime._async_compile import AsyncCompileMode

    from brisk.bench.configs import materialize
    from brisk.config import EngineArgs
    from brisk.engine.engine import LLMEngine

    log = CompileLog()
    triton.knobs.runtime.jit_cache_hook = log.before
    triton.knobs.runtime.jit_post_compile_hook = log.after
    start = time.perf_counter()
    with materialize(args.model) as model:
        engine = LLMEngine(EngineArgs(model=model, load_format="dummy", device=args.device, seed=0))
    total = time.perf_counter() - start
    triton.knobs.runtime.jit_cache_hook = triton.knobs.runtime.jit_post_compile_hook = None
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in engine.startup_seconds.items())
    print(f"engine built in {total:.2f} s ({'warm' if args.warm else 'fresh'} Triton cache): {phases}")

    per_kernel: dict[str, list[float]] = defaultdict(list)
    for jit_function, _, seconds in log.records:
        per_kernel[jit_function.fn.__qualname__].append(seconds)
    compile_total = sum(s for _, _, s in log.records)
    print(f"{len(log.records)} Triton compiles, {compile_total:.2f} s in all")
    for name, times in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {name:40s} {len(times):4d} compiles {sum(times):7.2f} s (max {max(times):.2f} s)")

    if args.threads and log.records:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-parallel-")
        device = torch.cuda.current_device() if engine.device.type == "cuda" else None
        for jit_function, _, _ in log.records:
            jit_function.device_caches[device][0].clear()
        start = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool, AsyncCompileMode(pool):
            for jit_function, spec, _ in log.records:
                jit_function.preload(spec)
        print(
            f"the same {len(log.records)} compiles in {args.threads} threads: {time.perf_counter() - start:.2f} s "
            f"(one after another at start-up: {compile_total:.2f} s)"
        )


if __name__ == "__main__":
    main()
