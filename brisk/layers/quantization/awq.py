"""AWQ checkpoints (``quant_method: awq``, AutoAWQ's GEMM layout): 4-bit weights stored input-major, eight a
int32 along the output dimension in AWQ's interleaved order, with a zero point and a scale per group of
``group_size`` inputs.

On the CPU the weight is dequantized for each matmul, ``(q - zero) * scale`` in float32 (exact). On CUDA it is
repacked once for the Triton kernels (``packed_int.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.quantization.base_config import QuantizationConfig, add_param, check_group_size
from brisk.layers.quantization.packed_int import kernel_linear, set_kernel_weights, use_int_kernels

PACK_FACTOR = 8  # 4-bit values per int32
# AWQ packs output columns 0..7 of a word in this order (nibble i holds column AWQ_ORDER[i]).
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[rows, cols / 8]`` to the unsigned 4-bit values ``[rows, cols]`` in column order."""
    shifts = torch.tensor([4 * AWQ_ORDER.index(c) for c in range(PACK_FACTOR)], device=packed.device)
    return ((packed[..., None] >> shifts) & 0xF).flatten(-2).to(torch.int8)


class AWQConfig(QuantizationConfig):
    name = "awq"

    def __init__(self, group_size: int, zero_point: bool, not_converted: list[str]):
        super().__init__()
        self.group_size = group_size
        self.zero_point = zero_point
        self.not_converted = not_converted

    @classmethod
    def from_config(cls, config: dict) -> AWQConfig:
        bits, version = config.get("bits", config.get("w_bit")), str(config.get("version", "gemm")).lower()
        if bits != 4:
            raise ValueError(f"AWQ checkpoint with bits={bits}: brisk loads 4-bit AWQ.")
        if version != "gemm":
            raise ValueError(f"AWQ checkpoint with version {version!r}: brisk loads AutoAWQ's GEMM layout.")
        group_size = config.get("group_size", config.get("q_group_size"))
        if not isinstance(group_size, int) or group_size <= 0:
            raise ValueError(f"AWQ checkpoint with group_size={group_size!r}: expected a positive group size.")
        return cls(group_size, bool(config.get("zero_point", True)), list(config.get("modules_to_not_convert") or []))

    def get_quant_method(self, layer: nn.Module, prefix: str) -> AWQLinearMethod | None:
        names = self.checkpoint_names(prefix)
        if any(skip in name for name in names for skip in self.not_converted):
            return None
        return AWQLinearMethod(self, prefix)


class AWQLinearMethod:
    def __init__(self, config: AWQConfig, prefix: str):
        self.config = config
        self.prefix = prefix

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        group = self.config.group_size
        check_group_size(f"AWQ {self.prefix}", layer, group, in_features)
        if any(size % PACK_FACTOR for size in layer.output_partition_sizes):
            raise ValueError(f"AWQ {self.prefix}: output sizes {layer.output_partition_sizes} are not multiples of 8.")
        groups, packed_cols = in_features // group, out_features // PACK_FACTOR
        packed = dict(input_dim=0, output_dim=1, packed_dim=1, packed_factor=PACK_FACTOR)
        add_param(layer, "qweight", torch.empty(in_features, packed_cols, dtype=torch.int32), **packed)
        if self.config.zero_point:
            add_param(layer, "qzeros", torch.empty(groups, packed_cols, dtype=torch.int32), **packed)
        add_param(layer, "scales", torch.empty(groups, out_features, dtype=dtype), input_dim=0, output_dim=1)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Unpacked once into ``[out, in]`` integers and ``[out, groups]`` zero points and scales (on CUDA, the
        kernels' layout instead)."""
        weight_q = unpack_awq(layer.qweight.data).t().contiguous()
        zeros = unpack_awq(layer.qzeros.data).t().contiguous() if self.config.zero_point else None
        self.use_kernel = use_int_kernels(layer.qweight)
        del layer.qweight
        if self.config.zero_point:
            del layer.qzeros
        if self.use_kernel:
            set_kernel_weights(layer, weight_q, layer.scales.data.t(), zeros, bits=4, group=self.config.group_size)
            del layer.scales
            return
        layer.weight_q = nn.Parameter(weight_q, requires_grad=False)
        if zeros is None:  # symmetric: the unsigned values are offset by 8
            zeros = torch.full_like(layer.scales.data.t(), 8, dtype=torch.int8)
        layer.weight_zero = nn.Parameter(zeros, requires_grad=False)
        layer.scales = nn.Parameter(layer.scales.data.float().t().contiguous(), requires_grad=False)

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        q = layer.weight_q.unflatten(-1, (layer.scales.shape[1], -1)).float()
        return ((q - layer.weight_zero.float()[..., None]) * layer.scales[..., None]).flatten(-2)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.use_kernel:
            return kernel_linear(layer, x, bias, 4, self.config.group_size)
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)
