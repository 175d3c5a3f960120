"""Linear layers in Megatron style. Each delegates its math to a ``quant_method`` so quantized formats plug in
without touching the models; fused q/k/v and gate/up projections load their shards through ``weight_loader``."""

from __future__ import annotations

import torch
from torch import nn

from brisk.distributed.parallel_state import get_tp_rank, get_tp_size, tensor_model_parallel_all_reduce
from brisk.layers.fused import dense


def check_loaded_shape(loaded: torch.Tensor, expected: tuple[int, ...]) -> None:
    """A checkpoint tensor must have the whole (unsharded) shape its layer expects: ``narrow`` would silently
    take part of a larger one, and ``copy_`` would broadcast a smaller one."""
    if tuple(loaded.shape) != tuple(expected):
        raise ValueError(f"checkpoint shape {tuple(loaded.shape)}, expected {tuple(expected)}")


class UnquantizedLinearMethod:
    """Plain dense weights: ``y = x W^T + b`` (a Triton GEMV at decode batch sizes on a GPU, else cuBLAS)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pass

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return dense(x, layer.weight, bias)


class LinearBase(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant_method=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, in_features, out_features, dtype)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None
        for param in (self.weight, self.bias):
            if param is not None:
                param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        check_loaded_shape(loaded, param.shape)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Output features split across tensor-parallel ranks; no communication in forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant_method=None):
        tp = get_tp_size()
        if out_features % tp:
            raise ValueError(f"output size {out_features} is not divisible by tensor_parallel_size={tp}")
        super().__init__(in_features, out_features // tp, bias, dtype, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = param.shape[0]
        check_loaded_shape(loaded, (size * get_tp_size(), *param.shape[1:]))
        param.data.copy_(loaded.narrow(0, get_tp_rank() * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one matmul (e.g. gate_proj and up_proj)."""

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, dtype: torch.dtype, quant_method=None):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), bias, dtype, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        tp = get_tp_size()
        offset = sum(self.output_sizes[:shard_id]) // tp
        size = self.output_sizes[shard_id] // tp
        check_loaded_shape(loaded, (self.output_sizes[shard_id], *param.shape[1:]))
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, get_tp_rank() * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection; KV heads are replicated when there are fewer of them than ranks."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        dtype: torch.dtype,
        quant_method=None,
    ):
        tp = get_tp_size()
        if num_heads % tp:
            raise ValueError(f"num_attention_heads={num_heads} is not divisible by tensor_parallel_size={tp}")
        if (num_kv_heads % tp) if num_kv_heads >= tp else (tp % num_kv_heads):
            raise ValueError(
                f"num_key_value_heads={num_kv_heads} and tensor_parallel_size={tp}: one must divide the other "
                "(KV heads are split across ranks, or replicated when there are fewer of them)"
            )
        self.head_size = head_size
        self.num_heads = num_heads // tp
        self.num_kv_heads = max(1, num_kv_heads // tp)
        self.kv_replicas = max(1, tp // num_kv_heads)
        self.total_num_heads, self.total_num_kv_heads = num_heads, num_kv_heads
        total = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp
        super().__init__(hidden_size, total, bias, dtype, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        rank = get_tp_rank()
        if shard_id == "q":
            offset, size, start = 0, q_size, rank * q_size
        else:
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, start = kv_size, (rank // self.kv_replicas) * kv_size
        heads = self.total_num_heads if shard_id == "q" else self.total_num_kv_heads
        check_loaded_shape(loaded, (heads * self.head_size, *param.shape[1:]))
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, start, size))


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed with an all-reduce."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant_method=None):
        tp = get_tp_size()
        if in_features % tp:
            raise ValueError(f"input size {in_features} is not divisible by tensor_parallel_size={tp}")
        super().__init__(in_features // tp, out_features, bias, dtype, quant_method)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param.dim() == 1:  # the bias is added once, after the reduction
            check_loaded_shape(loaded, param.shape)
            param.data.copy_(loaded)
            return
        size = param.shape[1]
        check_loaded_shape(loaded, (param.shape[0], size * get_tp_size()))
        param.data.copy_(loaded.narrow(1, get_tp_rank() * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if get_tp_size() == 1:
            return self.quant_method.apply(self, x, self.bias)
        out = tensor_model_parallel_all_reduce(self.quant_method.apply(self, x, None))
        return out if self.bias is None else out + self.bias
