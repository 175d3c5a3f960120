"""Picks the fused Triton kernels for tensors on a GPU, and the torch reference code everywhere else."""

from __future__ import annotations

import functools
from types import ModuleType

import torch


@functools.cache
def _triton_ops() -> ModuleType | None:
    try:
        from brisk.layers import triton_ops
    except ImportError:
        return None
    return triton_ops


def fused_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The ``triton_ops`` module when ``x`` lives on a CUDA device and Triton is installed, else None."""
    return _triton_ops() if x.is_cuda else None
