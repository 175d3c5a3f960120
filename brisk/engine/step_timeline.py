"""A line per engine step (``BRISK_STEP_TIMELINE=FILE``): when its results were booked, what the step held, and how
long the host spent booking them, so that a slow inter-token gap can be traced to the step behind it.

Every stream in a batch waits for the same steps, so a client's inter-token latency is the interval between two
bookings of the steps that carried its tokens. One JSON object a line (``benchmarks/step_timeline.py`` sums a
file up):

* ``t``: seconds since the first booked step; ``interval_ms``: since the previous booking (what a stream in
  both steps saw between two tokens);
* ``tokens``: tokens computed; ``prefill_tokens`` / ``prefill_seqs``: of them, the prompt tokens and the
  sequences they belong to; ``decode_seqs``: sequences that computed only generated tokens (speculative drafts
  included, counted in ``draft_tokens``);
* ``running`` / ``waiting``: the scheduler's queues after the step;
* ``apply_ms``: host time booking the step (stops, detokenization, outputs);
* ``full_gc``: full garbage collections since the previous line (each one a pause of the whole process).

Off by default; on, it costs a ``json.dumps`` and a write per step.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import IO

from brisk.engine.scheduler import SchedulerOutput


class StepTimeline:
    def __init__(self, path: str | None = None):
        path = path if path is not None else os.environ.get("BRISK_STEP_TIMELINE") or None
        # Line-buffered: a server's engine process may end by a signal, and a line a step is a few syscalls a second.
        self._file: IO[str] | None = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        self._first = self._last = 0.0
        self._full_gcs = gc.get_stats()[2]["collections"]

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def record(self, schedule: SchedulerOutput, apply_s: float, running: int, waiting: int) -> None:
        """One line for a step whose outputs were just made; ``apply_s``: the host's seconds booking them (the
        launch of a next step between booking and outputs not included)."""
        if self._file is None:
            return
        now = time.perf_counter()
        if not self._first:
            self._first = self._last = now - apply_s
        prefill_tokens = prefill_seqs = decode_seqs = 0
        for entry in schedule.scheduled:
            prompt_left = entry.request.num_prompt_tokens - entry.start
            if prompt_left > 0:
                prefill_tokens += min(prompt_left, entry.num_new_tokens)
                prefill_seqs += 1
            else:
                decode_seqs += 1
        full_gcs = gc.get_stats()[2]["collections"]
        line = {
            "t": round(now - self._first, 6),
            "interval_ms": round((now - self._last) * 1e3, 3),
            "tokens": schedule.total_num_tokens,
            "prefill_tokens": prefill_tokens,
            "prefill_seqs": prefill_seqs,
            "decode_seqs": decode_seqs,
            "draft_tokens": sum(len(d) for d in schedule.spec_token_ids.values()),
            "running": running,
            "waiting": waiting,
            "apply_ms": round(apply_s * 1e3, 3),
            "full_gc": full_gcs - self._full_gcs,
        }
        self._file.write(json.dumps(line) + "\n")
        self._last, self._full_gcs = now, full_gcs
