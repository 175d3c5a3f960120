"""compressed-tensors NVFP4A16 (``nvfp4-pack-quantized``): FP4 (E2M1) weights, two a byte (the even element in
the low nibble), a float8_e4m3fn scale per 16 inputs and a float32 global scale per tensor that divides them;
inputs stay unquantized.

The weight is dequantized for each matmul (``fp4 * (scale / global_scale)`` in float32; each fused projection
keeps its own global scale). FP4 tensor cores (compute capability 10+) and a dequantizing kernel for Hopper are
future work; NVFP4 with FP4 activations (W4A4) is refused."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.quantization.base_config import add_param, replace_param
from brisk.layers.quantization.compressed_tensors.schemes import (
    add_per_shard_scale,
    per_row,
    unsupported,
)

GROUP_SIZE = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0-7; bit 3 is the sign


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[rows, cols / 2]`` to the float32 FP4 values ``[rows, cols]``."""
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).long()
    magnitude = torch.tensor(E2M1_VALUES, device=packed.device)[codes & 0x07]
    return torch.where((codes & 0x08) != 0, -magnitude, magnitude)


class CompressedTensorsNVFP4A16:
    def __init__(self, weights: dict, prefix: str):
        self.prefix = prefix
        if weights.get("strategy") != "tensor_group" or weights.get("group_size") != GROUP_SIZE:
            raise unsupported(prefix, f"FP4 weights with strategy {weights.get('strategy')!r}, group size "
                              f"{weights.get('group_size')} (NVFP4: tensor_group, 16)")  # fmt: skip
        if not weights.get("symmetric", True):
            raise unsupported(prefix, "asymmetric FP4 weights")

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        if in_features % GROUP_SIZE:
            raise ValueError(
                f"compressed-tensors scheme of {self.prefix}: group_size {GROUP_SIZE} does not divide the input "
                f"size {in_features}."
            )
        packed = torch.empty(out_features, in_features // 2, dtype=torch.uint8)
        add_param(layer, "weight_packed", packed, output_dim=0, input_dim=1, packed_dim=1, packed_factor=2)
        scale = torch.empty(out_features, in_features // GROUP_SIZE, dtype=torch.float8_e4m3fn)
        add_param(layer, "weight_scale", scale, output_dim=0, input_dim=1)
        add_per_shard_scale(layer, "weight_global_scale")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        replace_param(layer, "weight_fp4", unpack_fp4(layer.weight_packed.data))
        del layer.weight_packed
        # The group scales over their rows' global scales, as compressed-tensors' dequantize divides them.
        replace_param(
            layer, "weight_scale", layer.weight_scale.data.float() / per_row(layer, layer.weight_global_scale)
        )
        del layer.weight_global_scale

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        return (layer.weight_fp4.unflatten(-1, (-1, GROUP_SIZE)) * layer.weight_scale[..., None]).flatten(-2)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)
