"""Tensor-parallel process-group state. A single process is rank 0 of a group of one; a worker process of a
tensor-parallel engine joins its group once, before it builds the model (one process is one rank)."""

from __future__ import annotations

import torch

_TP_RANK = 0
_TP_SIZE = 1
_TP_GROUP = None


def get_tp_rank() -> int:
    return _TP_RANK


def get_tp_size() -> int:
    return _TP_SIZE


def init_tensor_parallel(rank: int, size: int, group=None) -> None:
    """Make this process rank ``rank`` of a tensor-parallel group of ``size`` (``torch.distributed`` must be
    initialized; ``group=None`` is the default group of every process)."""
    global _TP_RANK, _TP_SIZE, _TP_GROUP
    if not 0 <= rank < size:
        raise ValueError(f"tensor-parallel rank {rank} is outside a group of {size}")
    _TP_RANK, _TP_SIZE, _TP_GROUP = rank, size, group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_SIZE == 1:
        return x
    torch.distributed.all_reduce(x, group=_TP_GROUP)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension, in rank order."""
    if _TP_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    torch.distributed.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=-1)
