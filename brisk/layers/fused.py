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


# Rows up to which a projection on a GPU takes the few-row Triton GEMV instead of cuBLAS.
GEMV_MAX_ROWS = 16


def gemv_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The ``triton_gemv`` module when ``x`` is a single row (a batch-1 decode step) on a CUDA device, else None.

    For one row a projection is a read of its weights, which the GEMV streams faster than cuBLAS and fuses with
    the op before it (``benchmarks/tune_gemv.py``); larger batches go to cuBLAS.
    """
    if not x.is_cuda or x.dim() != 2 or x.shape[0] != 1:
        return None
    return _triton_module("triton_gemv")


def fp8_activation_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The ``quantization.triton_fp8_activation`` module when ``x`` (contiguous rows) has more rows than the
    GEMVs take, on a CUDA device: there the op before a projection that multiplies FP8 inputs on FP8 tensor cores
    can write that input itself."""
    if not x.is_cuda or x.dim() != 2 or x.shape[0] <= GEMV_MAX_ROWS or x.stride(-1) != 1:
        return None
    return _triton_module("quantization.triton_fp8_activation")


@functools.cache
def has_bf16_tensor_cores(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= (8, 0)


def gemv_rows_ops_for(x: torch.Tensor) -> ModuleType | None:
    """The ``triton_gemv_rows`` module when ``x`` has 2 to ``GEMV_MAX_ROWS`` rows on a CUDA GPU of compute
    capability 8.0 or newer (its tensor-core tiles take bf16), else None: small decode batches and speculative
    verification, where the projections are still weight reads and the GEMV reads them faster than cuBLAS
    (``benchmarks/tune_gemv_rows.py``)."""
    if not x.is_cuda or x.dim() != 2 or not 2 <= x.shape[0] <= GEMV_MAX_ROWS:
        return None
    return _triton_module("triton_gemv_rows") if has_bf16_tensor_cores(x.device) else None


def scaled_dense(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``x (weight * weight_scale)^T + bias`` for an 8-bit ``weight`` (FP8 or INT8, a float32 scale per output
    row) through the weight-only GEMVs, where ``gemv_ops_for`` or ``gemv_rows_ops_for`` picks one; else None
    (the caller's GEMM). A few rows are bound by the weight's bytes, which these read once, widened in
    registers, leaving the input unquantized."""
    gemv = gemv_ops_for(x)
    if gemv is not None:
        return gemv.gemv(x, weight, bias, weight_scale.reshape(-1))
    gemv_rows = gemv_rows_ops_for(x)
    if gemv_rows is not None:
        return gemv_rows.gemv_rows(x, weight, bias, weight_scale)
    return None


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, as a Triton GEMV when ``gemv_ops_for`` or ``gemv_rows_ops_for`` picks one."""
    gemv = gemv_ops_for(x)
    if gemv is not None:
        return gemv.gemv(x, weight, bias)
    gemv_rows = gemv_rows_ops_for(x)
    if gemv_rows is not None:
        return gemv_rows.gemv_rows(x, weight, bias)
    return F.linear(x, weight, bias)
