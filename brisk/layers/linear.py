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


def set_weight_attrs(param: nn.Parameter, **attrs) -> nn.Parameter:
    """Tag a parameter with how the weight loaders shard it (vLLM's names): ``output_dim`` / ``input_dim``, the
    dimensions that follow the layer's outputs / inputs (absent: the tensor is replicated); ``packed_dim`` with
    ``packed_factor``, a dimension holding ``packed_factor`` logical rows per stored row (packed int4, group
    scales); ``per_shard``, one entry per fused projection (a per-tensor scale of q, k and v each)."""
    for key, value in attrs.items():
        setattr(param, key, value)
    return param


def _stored_rows(param: nn.Parameter, dim: int, logical: int) -> int:
    """How many stored entries along ``dim`` hold ``logical`` rows (fewer where that dimension is packed)."""
    if getattr(param, "packed_dim", None) == dim:
        return logical // param.packed_factor
    return logical


def _load_rank_slice(param: nn.Parameter, loaded: torch.Tensor, dim: int) -> None:
    """This rank's slice along ``dim`` of a checkpoint tensor that holds every rank's (sharded along ``dim``)."""
    size = param.shape[dim]
    expected = list(param.shape)
    expected[dim] = size * get_tp_size()
    check_loaded_shape(loaded, expected)
    param.data.copy_(loaded.narrow(dim, get_tp_rank() * size, size))


def _load_shard_entry(param: nn.Parameter, loaded: torch.Tensor, index: int) -> None:
    """A per-tensor value of one fused projection (its own scale, its weight's shape) into entry ``index``."""
    entry = param.data[index]
    if loaded.numel() != entry.numel() or loaded.dim() > max(entry.dim(), 1):
        raise ValueError(f"checkpoint shape {tuple(loaded.shape)}, expected {entry.numel()} value(s)")
    entry.copy_(loaded.reshape(entry.shape))


class UnquantizedLinearMethod:
    """Plain dense weights: ``y = x W^T + b`` (a Triton GEMV at decode batch sizes on a GPU, else cuBLAS)."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        layer.weight = set_weight_attrs(weight, output_dim=0, input_dim=1)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        pass

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return dense(x, layer.weight, bias)


class LinearBase(nn.Module):
    """``quant_config`` (a ``brisk.layers.quantization`` config, or None for plain weights) picks this layer's
    ``quant_method`` from its ``prefix`` (the checkpoint's module name, for the config's ignore list), which
    creates the parameters; ``output_partition_sizes`` are this rank's fused outputs (q, k, v or gate, up).
    ``input_is_parallel``: each rank holds a slice of the inputs (row-parallel), so a quant method that derives
    anything from whole weight rows (a per-channel scale) must reduce it over the ranks."""

    input_is_parallel = False

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        quant_config=None,
        prefix: str = "",
        output_partition_sizes: list[int] | None = None,
    ):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.output_partition_sizes = output_partition_sizes or [out_features]
        self.prefix = prefix
        quant_method = quant_config.get_quant_method(self, prefix) if quant_config is not None else None
        self.quant_method = quant_method or UnquantizedLinearMethod()
        self.quant_method.create_weights(self, in_features, out_features, dtype)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), requires_grad=False) if bias else None
        if self.bias is not None:
            set_weight_attrs(self.bias, output_dim=0)
        for param in self.parameters(recurse=False):
            param.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if getattr(param, "per_shard", False):
            _load_shard_entry(param, loaded, 0)
            return
        check_loaded_shape(loaded, param.shape)
        param.data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Output features split across tensor-parallel ranks; no communication in forward."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        quant_config=None,
        prefix: str = "",
        output_partition_sizes: list[int] | None = None,
    ):
        tp = get_tp_size()
        if out_features % tp:
            raise ValueError(f"output size {out_features} is not divisible by tensor_parallel_size={tp}")
        super().__init__(in_features, out_features // tp, bias, dtype, quant_config, prefix, output_partition_sizes)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        dim = getattr(param, "output_dim", None)
        if dim is None:
            super().weight_loader(param, loaded, shard_id)
        else:
            _load_rank_slice(param, loaded, dim)

    def _load_fused_shard(
        self, param: nn.Parameter, loaded: torch.Tensor, index: int, rows: int, start: int, total: int
    ) -> None:
        """Load projection ``index`` of a fused layer: ``total`` checkpoint rows, of which this rank keeps ``rows``
        from ``start`` (logical rows; packed parameters store fewer). Per-shard values go to their entry and
        replicated tensors (no ``output_dim``) are copied whole."""
        if getattr(param, "per_shard", False):
            _load_shard_entry(param, loaded, index)
            return
        dim = getattr(param, "output_dim", None)
        if dim is None:
            check_loaded_shape(loaded, param.shape)
            param.data.copy_(loaded)
            return
        offset = _stored_rows(param, dim, sum(self.output_partition_sizes[:index]))
        rows, start = _stored_rows(param, dim, rows), _stored_rows(param, dim, start)
        expected = list(param.shape)
        expected[dim] = _stored_rows(param, dim, total)
        check_loaded_shape(loaded, expected)
        param.data.narrow(dim, offset, rows).copy_(loaded.narrow(dim, start, rows))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one matmul (e.g. gate_proj and up_proj)."""

    def __init__(
        self,
        in_features: int,
        output_sizes: list[int],
        bias: bool,
        dtype: torch.dtype,
        quant_config=None,
        prefix: str = "",
    ):
        self.output_sizes = output_sizes
        partitions = [size // get_tp_size() for size in output_sizes]
        super().__init__(in_features, sum(output_sizes), bias, dtype, quant_config, prefix, partitions)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = self.output_partition_sizes[shard_id]
        self._load_fused_shard(param, loaded, shard_id, size, get_tp_rank() * size, self.output_sizes[shard_id])


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
        quant_config=None,
        prefix: str = "",
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
        q_size, kv_size = self.num_heads * head_size, self.num_kv_heads * head_size
        total = (self.num_heads + 2 * self.num_kv_heads) * head_size * tp
        super().__init__(hidden_size, total, bias, dtype, quant_config, prefix, [q_size, kv_size, kv_size])

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        index = "qkv".index(shard_id)
        size = self.output_partition_sizes[index]
        rank = get_tp_rank()
        start = rank * size if shard_id == "q" else (rank // self.kv_replicas) * size
        heads = self.total_num_heads if shard_id == "q" else self.total_num_kv_heads
        self._load_fused_shard(param, loaded, index, size, start, heads * self.head_size)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial outputs are summed with an all-reduce."""

    input_is_parallel = True

    def __init__(
        self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant_config=None, prefix: str = ""
    ):
        tp = get_tp_size()
        if in_features % tp:
            raise ValueError(f"input size {in_features} is not divisible by tensor_parallel_size={tp}")
        super().__init__(in_features // tp, out_features, bias, dtype, quant_config, prefix)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        dim = getattr(param, "input_dim", None)
        if dim is None:  # the bias (added once, after the reduction), per-tensor scales
            super().weight_loader(param, loaded, shard_id)
        else:
            _load_rank_slice(param, loaded, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if get_tp_size() == 1:
            return self.quant_method.apply(self, x, self.bias)
        out = tensor_model_parallel_all_reduce(self.quant_method.apply(self, x, None))
        return out if self.bias is None else out + self.bias
