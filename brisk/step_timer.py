"""Optional per-phase timing of engine steps (``BRISK_STEP_TIMING=1``), to see where a step's time goes.

When on, the GPU is synchronized after the forward pass so device time is not billed to the phase that
happens to wait for it; that costs a little overlap, so leave it off for headline figures.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

import torch


class StepTimer:
    PHASES = ("schedule", "prepare", "forward", "sample", "update", "outputs")

    def __init__(self, device: torch.device, enabled: bool | None = None):
        self.enabled = os.environ.get("BRISK_STEP_TIMING") == "1" if enabled is None else enabled
        self.device = device
        self.totals: dict[str, float] = defaultdict(float)
        self.steps = 0
        self._last = 0.0

    def start(self) -> None:
        if self.enabled:
            self.steps += 1
            self._last = time.perf_counter()

    def mark(self, phase: str, sync: bool = False) -> None:
        if not self.enabled:
            return
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.totals[phase] += now - self._last
        self._last = now

    def summary(self) -> str:
        total = sum(self.totals.values()) or 1e-9
        parts = ", ".join(
            f"{p} {self.totals[p] / max(self.steps, 1) * 1e3:.3f} ms ({self.totals[p] / total:.0%})"
            for p in self.PHASES
        )
        return f"{self.steps} steps, per step: {parts}"
