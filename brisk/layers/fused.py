"""Picks the fused Triton kernels for tensors on a GPU, and the torch reference code everywhere else."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch
import torch.nn.functional as F


@functools.cache
def _triton_module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"brisk.layers.{name}")
    except ImportError:
        return None


def fused_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The ``triton_ops`` module when ``x`` lives on a CUDA device and Triton is installed, else None."""
    return _triton_module("triton_ops") if x.is_cuda else None


def gemv_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The ``triton_gemv`` module when ``x`` is a single row (a batch-1 decode step) on a CUDA device, else None.

    For one row a projection is a read of its weights, which the GEMV streams faster than cuBLAS and fuses with
    the op before it (``benchmarks/tune_gemv.py``); larger batches go to cuBLAS.
    """
    if not x.is_cuda or x.dim() != 2 or x.shape[0] != 1:
        return None
    return _triton_module("triton_gemv")


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, as the Triton GEMV when ``gemv_ops_for(x)`` picks it."""
    gemv = gemv_ops_for(x)
    if gemv is not None:
        return gemv.gemv(x, weight, bias)
    return F.linear(x, weight, bias)
