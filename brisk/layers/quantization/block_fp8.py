"""Block-wise FP8 checkpoints in transformers' FineGrainedFP8 layout (``quant_method: "fp8"`` with
``weight_block_size``, the layout of DeepSeek-V3's and Qwen3's FP8 releases): FP8 (E4M3) weights ``[out, in]`` and
a float32 scale per block of ``[block_out, block_in]`` weights, ``weight_scale_inv`` (multiplied, despite its
name).

Weight-only: each matmul dequantizes the weight block by block in float32, as transformers' dequantizing load does,
into the input's dtype, and leaves the input unquantized (vLLM quantizes it per token and 128 channels). The
weights stay in memory as FP8, a byte each plus a scale per block; on a GPU this is an emulation, not an FP8
GEMM: every matmul pays for dequantizing its weight.

A fused layer (q/k/v, gate/up) holds its parts' blocks one after another, so each part's outputs, and each rank's
share of the inputs, must be whole blocks; checkpoints made for transformers are (it derives the block from
the scales' grid)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.distributed.parallel_state import get_tp_size
from brisk.layers.quantization.base_config import add_param


def block_shape(value) -> tuple[int, int] | None:
    """A block size as configs give it (two positive integers), or None if ``value`` is not one."""
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value):
        return tuple(value)
    return None


class BlockFp8Weights:
    """FP8 weights ``[out, in]`` and a float32 scale per block of ``[block_out, block_in]`` of them, under the
    checkpoint's ``scale_name``; what transformers' layout and compressed-tensors' ``block`` strategy share."""

    scale_name: str

    def __init__(self, block: tuple[int, int], prefix: str):
        self.block_out, self.block_in = block
        self.prefix = prefix

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        sizes = layer.output_partition_sizes
        if in_features % self.block_in or any(size % self.block_out for size in sizes):
            ranks = get_tp_size()
            per_rank = f" per rank (tensor_parallel_size={ranks})" if ranks > 1 else ""
            raise ValueError(
                f"block-wise FP8 layer {self.prefix}: blocks of [{self.block_out}, {self.block_in}] do not tile its "
                f"weight: outputs {sizes} (one entry per fused part), inputs {in_features}{per_rank}."
            )
        weight = torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn)
        add_param(layer, "weight", weight, output_dim=0, input_dim=1)
        # One row of scales per block_out outputs: a fused part's rows start at its first output over block_out.
        scales = torch.empty(out_features // self.block_out, in_features // self.block_in, dtype=torch.float32)
        add_param(layer, self.scale_name, scales, output_dim=0, input_dim=1, packed_dim=0,
                  packed_factor=self.block_out)  # fmt: skip

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None  # computed with as loaded

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        """The weight in float32: each block times its scale."""
        blocks = layer.weight.float().unflatten(0, (-1, self.block_out)).unflatten(-1, (-1, self.block_in))
        return (blocks * getattr(layer, self.scale_name)[:, None, :, None]).flatten(-2).flatten(0, 1)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Weight-only: the input as it is, times the dequantized weight."""
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)


class BlockFp8LinearMethod(BlockFp8Weights):
    """transformers' FineGrainedFP8 layout."""

    scale_name = "weight_scale_inv"
