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


def tensor_model_parallel_all_reduce(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``x`` summed (or with ``op="max"``, its largest value) over the tensor-parallel group, in place."""
    if _TP_SIZE == 1:
        return x
    reduce_op = {"sum": torch.distributed.ReduceOp.SUM, "max": torch.distributed.ReduceOp.MAX}[op]
    torch.distributed.all_reduce(x, op=reduce_op, group=_TP_GROUP)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension, in rank order."""
    if _TP_SIZE == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP_SIZE)]
    torch.distributed.all_gather(parts, x.contiguous(), group=_TP_GROUP)
    return torch.cat(parts, dim=-1)


# ---- pipeline parallelism: stages own contiguous layers; activations go to the next stage's rank of the same
# tensor-parallel index by point-to-point send/recv ----------------------------------------------------------------
_PP_RANK = 0
_PP_SIZE = 1
_PP_PREV: int | None = None  # global rank that sends this stage its input
_PP_NEXT: int | None = None  # global rank this stage sends its output to


def init_pipeline_parallel(rank: int, size: int, prev_rank: int | None, next_rank: int | None) -> None:
    global _PP_RANK, _PP_SIZE, _PP_PREV, _PP_NEXT
    if not 0 <= rank < size:
        raise ValueError(f"pipeline-parallel rank {rank} is outside {size} stages")
    _PP_RANK, _PP_SIZE, _PP_PREV, _PP_NEXT = rank, size, prev_rank, next_rank


def get_pp_rank() -> int:
    return _PP_RANK


def get_pp_size() -> int:
    return _PP_SIZE


def is_first_stage() -> bool:
    return _PP_RANK == 0


def is_last_stage() -> bool:
    return _PP_RANK == _PP_SIZE - 1


def stage_layers(num_layers: int, rank: int | None = None, size: int | None = None) -> range:
    """The contiguous layers a stage owns (this process's stage by default); earlier stages get the smaller share."""
    rank = _PP_RANK if rank is None else rank
    size = _PP_SIZE if size is None else size
    return range(rank * num_layers // size, (rank + 1) * num_layers // size)


def send_to_next_stage(tensors: list[torch.Tensor]) -> None:
    for tensor in tensors:
        torch.distributed.send(tensor.contiguous(), dst=_PP_NEXT)


def recv_from_prev_stage(count: int, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """``count`` tensors of one shape from the previous stage (every stage knows the step's token count)."""
    tensors = [torch.empty(shape, dtype=dtype, device=device) for _ in range(count)]
    for tensor in tensors:
        torch.distributed.recv(tensor, src=_PP_PREV)
    return tensors
