"""Tensor-parallel process-group state. A single process is rank 0 of a group of one."""

from __future__ import annotations

import torch

_TP_RANK = 0
_TP_SIZE = 1
_TP_GROUP = None


def get_tp_rank() -> int:
    return _TP_RANK


def get_tp_size() -> int:
    return _TP_SIZE


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP_SIZE == 1:
        return x
    torch.distributed.all_reduce(x, group=_TP_GROUP)
    return x
