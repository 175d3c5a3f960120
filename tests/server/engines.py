"""Engine classes for the in-process server tests. ``AsyncLLM`` builds its engine in a child process, so these
live in an importable module: the class is pickled by reference (``engine_cls=FaultyEngine``) and imported
there. Tests reach the instance in the child through ``AsyncLLM.call_engine``."""

from __future__ import annotations

import time

from brisk.engine.engine import LLMEngine


class CheckedEngine(LLMEngine):
    """A real engine that can report whether anything leaked (requests or KV blocks)."""

    def leak_report(self) -> dict[str, int]:
        pool = self.kv_cache_manager.pool
        return {
            "unfinished": self.get_num_unfinished_requests(),
            "free_blocks": self.kv_cache_manager.num_free_blocks,
            "num_blocks": pool.num_blocks,
        }


class FaultyEngine(CheckedEngine):
    """A real engine with the faults a correct engine cannot produce here, each armed by :meth:`arm`."""

    fail_next_step = False  # the next step's model forward raises (after scheduling, like a CUDA error)
    fail_next_add = False  # the next add_request raises a TypeError (a bug, not the request's fault)
    die = False  # has_unfinished_requests() raises: the engine loop itself breaks
    slow_next_step = 0.0  # seconds the next step takes on top of its work (sleeping frees the GIL, as torch does)

    def arm(self, **flags: bool | float) -> None:
        for name, value in flags.items():
            if name not in ("fail_next_step", "fail_next_add", "die", "slow_next_step"):
                raise AttributeError(f"no fault named {name!r}")
            setattr(self, name, value)

    def step(self):
        if self.slow_next_step:
            seconds, self.slow_next_step = self.slow_next_step, 0.0
            time.sleep(seconds)
        if not self.fail_next_step:
            return super().step()
        self.fail_next_step = False

        def forward_fails(*args, **kwargs):
            raise RuntimeError("CUDA error: device-side assert (simulated)")

        self.model_runner.execute = forward_fails
        try:
            return super().step()
        finally:
            del self.model_runner.execute

    def add_request(self, *args, **kwargs):
        if self.fail_next_add:
            self.fail_next_add = False
            raise TypeError("add_request() got an unexpected keyword argument (simulated bug)")
        return super().add_request(*args, **kwargs)

    def has_unfinished_requests(self):
        if self.die:
            raise SystemError("the loop itself broke")
        return super().has_unfinished_requests()
