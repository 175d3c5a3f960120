"""Triton kernels compiled in parallel at start-up, before the passes that need them.

Triton compiles a kernel the first time it is launched with a new specialization, on the launching thread, one
compile after another: on a fresh Triton cache an 8B model's start compiled 30 kernels in 16.7 s that way, and
in 4.5 s on 16 threads (H100; benchmarks/results/HISTORY.md, thirtieth run). ``DeferredCompiles`` records, instead of
compiling and launching, every launch of an uncompiled kernel in a forward pass per shape (Triton's
``jit_cache_hook`` returning True), then compiles the records on a pool of threads through Triton's
``AsyncCompileMode``: the code generator holds the interpreter lock, while LLVM and ``ptxas`` (a process) run
beside it. The passes after it find every kernel compiled and loaded.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

logger = logging.getLogger(__name__)

# At most this many compiles run at once (and no more than the cores this process may use).
MAX_COMPILE_THREADS = 16


class _NotCompiledYet:
    """What a deferred specialization's kernel cache holds until it is compiled: its launches do nothing, and
    cost no more than a cached kernel's (a miss would serialize the specialization again at every launch)."""

    function = packed_metadata = None

    def launch_metadata(self, *_) -> None:
        return None

    def run(self, *_) -> None:
        return None


_NOT_COMPILED_YET = _NotCompiledYet()


class DeferredCompiles:
    """The kernel specializations launched under ``recording()`` that were not yet compiled, to compile at once.

    Use it as a context manager: on leaving the block without an error, everything recorded is compiled; either
    way no stand-in is left in a kernel's cache (a launch would silently do nothing)."""

    def __init__(self) -> None:
        self._pending: dict[tuple[int, str], tuple[object, str]] = {}  # (kernel id, spec) -> (JITFunction, spec)
        self._stand_ins: list[tuple[dict, object]] = []  # (a kernel's cache, key) given _NOT_COMPILED_YET
        self._recording_thread: int | None = None
        self._other_threads_hook = None

    def __len__(self) -> int:
        return len(self._pending)

    def __enter__(self) -> DeferredCompiles:
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            if exc_type is None:
                self.compile_all()
        finally:
            self._settle_stand_ins()

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Launches of Triton kernels by this thread in this block that would compile are recorded and skipped
        instead (the hook is the process's: another thread's launches compile as they would have)."""
        from triton import knobs

        self._other_threads_hook = knobs.runtime.jit_cache_hook
        self._recording_thread = threading.get_ident()
        knobs.runtime.jit_cache_hook = self._record
        try:
            yield
        finally:
            knobs.runtime.jit_cache_hook = self._other_threads_hook
            self._recording_thread = None

    def _record(self, *, key, fn, compile, **kwargs) -> bool | None:
        if threading.get_ident() != self._recording_thread:
            hook = self._other_threads_hook
            return hook(key=key, fn=fn, compile=compile, **kwargs) if hook else None
        jit_function = fn.jit_function
        cache = jit_function.device_caches[compile["device"]][0]
        cache[key] = _NOT_COMPILED_YET  # the compile replaces it
        self._stand_ins.append((cache, key))
        self.add(jit_function, compile["specialization_data"])
        return True  # skip this compile and its launch

    def _settle_stand_ins(self) -> None:
        """Leave each recorded key with a compiled kernel or nothing: not a stand-in, nor a pending compile that
        another key's compile of the same source stood for (``AsyncCompileMode`` compiles that once)."""
        from triton.runtime._async_compile import FutureKernel

        for cache, key in self._stand_ins:
            entry = cache.get(key)
            kernel = entry.result(ignore_errors=True) if isinstance(entry, FutureKernel) else entry
            if kernel is None or kernel is _NOT_COMPILED_YET:
                cache.pop(key, None)
            else:
                cache[key] = kernel
        self._stand_ins.clear()

    def add(self, jit_function, specialization_data: str) -> None:
        """Record one kernel specialization (Triton's serialized ``specialization_data``) to compile."""
        self._pending.setdefault((id(jit_function), specialization_data), (jit_function, specialization_data))

    def compile_all(self, threads: int = MAX_COMPILE_THREADS) -> None:
        """Compile every recorded specialization on up to ``threads`` threads and load it onto the device; each
        lands in its kernel's cache (and Triton's cache on disk). A compile that fails on the pool is retried
        alone, where its error is raised: never first inside a CUDA graph capture."""
        if not self._pending:
            return
        from triton.runtime._async_compile import AsyncCompileMode

        start = time.perf_counter()
        workers = max(1, min(threads, len(os.sched_getaffinity(0)), len(self._pending)))
        with ThreadPoolExecutor(workers) as pool, AsyncCompileMode(pool, ignore_errors=True):
            futures = [jit_function.preload(spec) for jit_function, spec in self._pending.values()]
        for (jit_function, spec), future in zip(self._pending.values(), futures):
            kernel = future.result(ignore_errors=True)
            if kernel is None:
                logger.warning("compiling %s on a thread pool failed; compiling it alone", jit_function)
                kernel = jit_function.preload(spec)
            # Load the module now, as a first launch would: that launch may be inside a CUDA graph capture.
            kernel._init_handles()
        logger.info(
            "compiled %d Triton kernels on %d threads in %.1f s", len(self._pending), workers,
            time.perf_counter() - start,
        )  # fmt: skip
        self._pending.clear()
