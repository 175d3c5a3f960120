"""compressed-tensors FP4 weights (E2M1, two a byte, the even element in the low nibble); inputs stay unquantized:

- NVFP4A16 (``nvfp4-pack-quantized``): a float8_e4m3fn scale per 16 inputs and a float32 global scale per tensor
  that divides them (each fused projection keeps its own global scale);
- MXFP4A16 (``mxfp4-pack-quantized``, the OCP microscaling format): a power-of-two scale per 32 inputs, stored as
  its biased exponent (E8M0: a uint8 ``e`` stands for ``2 ** (e - 127)``).

The weight stays packed (half a byte a value, its group scales as float32: 0.75 bytes a weight against bf16's 2)
and is dequantized for each matmul (``fp4 * scale`` in float32, as compressed-tensors' dequantize computes it,
rounded once to the input's dtype): on a GPU in one Triton launch (``triton_fp4.py``), then cuBLAS. FP4 tensor
cores (compute capability 10+) and a GEMV that decodes FP4 in registers are future work; FP4 activations (W4A4)
are refused."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.quantization.base_config import add_param, check_group_size, replace_param
from brisk.layers.quantization.compressed_tensors.schemes import (
    add_per_shard_scale,
    per_row,
    unsupported,
)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of codes 0-7; bit 3 is the sign


def dequantize_fp4(packed: torch.Tensor, scales: torch.Tensor, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``dtype`` weight of uint8 ``packed`` FP4 values and their float32 group ``scales``: the Triton kernel
    on a GPU, torch elsewhere (the same arithmetic, bit for bit)."""
    if packed.is_cuda:
        from brisk.layers.quantization import triton_fp4

        return triton_fp4.dequantize_fp4(packed, scales, group_size, dtype)
    return (unpack_fp4(packed).unflatten(-1, (-1, group_size)) * scales[..., None]).flatten(-2).to(dtype)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[rows, cols / 2]`` to the float32 FP4 values ``[rows, cols]``."""
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).flatten(-2).long()
    magnitude = torch.tensor(E2M1_VALUES, device=packed.device)[codes & 0x07]
    return torch.where((codes & 0x08) != 0, -magnitude, magnitude)


class CompressedTensorsFP4A16:
    """What both FP4 formats share: the packed values, a scale per ``group_size`` inputs, the dequantized matmul."""

    group_size: int
    scale_dtype: torch.dtype

    def __init__(self, weights: dict, prefix: str):
        self.prefix = prefix
        if not weights.get("symmetric", True):
            raise unsupported(prefix, "asymmetric FP4 weights")

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        check_group_size(f"compressed-tensors scheme of {self.prefix}", layer, self.group_size, in_features)
        packed = torch.empty(out_features, in_features // 2, dtype=torch.uint8)
        add_param(layer, "weight_packed", packed, output_dim=0, input_dim=1, packed_dim=1, packed_factor=2)
        scale = torch.empty(out_features, in_features // self.group_size, dtype=self.scale_dtype)
        add_param(layer, "weight_scale", scale, output_dim=0, input_dim=1)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        replace_param(layer, "weight_packed", layer.weight_packed.data.contiguous())
        replace_param(layer, "weight_scale", self.float_scales(layer).contiguous())

    def float_scales(self, layer: nn.Module) -> torch.Tensor:
        """The group scales as float32 (what multiplies the FP4 values)."""
        raise NotImplementedError

    def dequantized_weight(self, layer: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequantize_fp4(layer.weight_packed, layer.weight_scale, self.group_size, dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(layer, x.dtype), bias)


class CompressedTensorsNVFP4A16(CompressedTensorsFP4A16):
    group_size, scale_dtype = 16, torch.float8_e4m3fn

    def __init__(self, weights: dict, prefix: str):
        super().__init__(weights, prefix)
        if weights.get("strategy") != "tensor_group" or weights.get("group_size") != self.group_size:
            raise unsupported(prefix, f"FP4 weights with strategy {weights.get('strategy')!r}, group size "
                              f"{weights.get('group_size')} (NVFP4: tensor_group, 16)")  # fmt: skip

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        super().create_weights(layer, in_features, out_features, dtype)
        add_per_shard_scale(layer, "weight_global_scale")

    def float_scales(self, layer: nn.Module) -> torch.Tensor:
        # The group scales over their rows' global scales, as compressed-tensors' dequantize divides them.
        scales = layer.weight_scale.data.float() / per_row(layer, layer.weight_global_scale)
        del layer.weight_global_scale
        return scales


class CompressedTensorsMXFP4A16(CompressedTensorsFP4A16):
    group_size, scale_dtype = 32, torch.uint8

    def __init__(self, weights: dict, prefix: str):
        super().__init__(weights, prefix)
        if weights.get("strategy") != "group" or weights.get("group_size") != self.group_size:
            raise unsupported(prefix, f"FP4 weights with strategy {weights.get('strategy')!r}, group size "
                              f"{weights.get('group_size')} (MXFP4: group, 32)")  # fmt: skip

    def float_scales(self, layer: nn.Module) -> torch.Tensor:
        return torch.exp2(layer.weight_scale.data.float() - 127.0)  # E8M0: exact powers of two
