"""Programmatic dependent launch (PDL) for the Triton kernels of a decode step.

A batch-1 decode step is a chain of short kernels, and each boundary costs the time for one grid to drain and
the next to launch and ramp up. With PDL (compute capability 9.0+), a kernel is launched while its
predecessor still runs: it may do work that does not depend on the predecessor (a GEMV loads its first weight
tile), then ``gdc_wait`` blocks until the predecessor has finished and its writes are visible. Every kernel that
is launched this way waits before its first dependent load and before any store, so it never reads stale data
and never writes memory that the predecessor may still read. Kernels launched without PDL (torch's) keep plain
stream order, and ``gdc_wait`` is a no-op in a kernel launched without the attribute.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def uses_pdl(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL: a GPU of compute capability 9.0 or newer, not interpreted."""
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def pdl_launch_options(device: torch.device, num_tokens: int) -> dict:
    """Keyword arguments for a Triton launch whose kernel takes a ``USE_PDL`` constexpr.

    PDL is used for launches over a single token (or sequence): batch-1 decode, where kernel boundaries are a
    large share of the step and where it was measured (``benchmarks/tune_gemv.py``). Larger batches keep plain
    stream order, so their CUDA graphs carry no programmatic edges.
    """
    if num_tokens == 1 and uses_pdl(device):
        return {"USE_PDL": True, "launch_pdl": True}
    return {"USE_PDL": False}


@triton.jit
def allow_next_kernel(USE_PDL: tl.constexpr):
    """Let the next kernel in the stream launch now (it still waits for this one before using its results)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def wait_for_previous_kernel(USE_PDL: tl.constexpr):
    """Block until the previous kernel in the stream has finished and its writes are visible."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def start_dependent_kernel(USE_PDL: tl.constexpr):
    """The prologue of a kernel whose every load depends on the previous kernel: let the next one launch, wait."""
    allow_next_kernel(USE_PDL)
    wait_for_previous_kernel(USE_PDL)


@triton.jit
def prefetch_line_to_l2(ptr, USE_PDL: tl.constexpr):
    """Under PDL, ask for the cache line at ``ptr`` to be brought into L2 (issued before the wait, so that a later
    dependent access, e.g. an atomic, finds it there instead of in HBM). A no-op otherwise (and in the interpreter,
    which runs no PTX)."""
    if USE_PDL:
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
            "=r,l",
            [ptr.to(tl.int64, bitcast=True)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
