"""compressed-tensors block-wise FP8 (``float-quantized`` with weights strategy ``block``: llmcompressor's
``FP8_BLOCK``): FP8 weights with a scale per block of ``block_structure`` weights (``block_fp8.py`` holds and
dequantizes them); inputs quantized at run time per token and group of ``group_size`` channels (the preset's
128), per token, or not at all.

Blocks of 128 x 128 with inputs in groups of 128 (the preset) run as an FP8 GEMM on Hopper and later GPUs
(``block_fp8.block_fp8_gemm``; one row through the weight-only few-row GEMV). Everything else is emulated: the
inputs are quantized and dequantized in float32 as compressed-tensors does, and each matmul multiplies them by the
dequantized weight in float32."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.quantization.block_fp8 import GEMM_BLOCK, BlockFp8Weights, block_shape
from brisk.layers.quantization.compressed_tensors.schemes import unsupported
from brisk.layers.quantization.fp8_utils import dequantize, quantize_fp8_per_row


class CompressedTensorsW8A8Fp8Block(BlockFp8Weights):
    scale_name = "weight_scale"

    def __init__(self, weights: dict, inputs: dict | None, prefix: str):
        block = weights.get("block_structure")
        if isinstance(block, str) and re.fullmatch(r"\d+x\d+", block):  # the library's older spelling, "128x128"
            block = [int(size) for size in block.split("x")]
        block = block_shape(block)
        if block is None:
            raise unsupported(
                prefix, f"block_structure {weights.get('block_structure')!r} (two positive integers expected)"
            )
        super().__init__(block, prefix)
        self.input_strategy = None if inputs is None else inputs.get("strategy")
        if inputs is not None:
            if inputs.get("type") != "float" or inputs.get("num_bits") != 8 or not inputs.get("symmetric", True):
                raise unsupported(prefix, f"block-wise FP8 weights with {inputs.get('type')} "
                                          f"{inputs.get('num_bits')}-bit inputs")  # fmt: skip
            if not inputs.get("dynamic") or self.input_strategy not in ("group", "token"):
                raise unsupported(prefix, f"block-wise FP8 weights with input strategy {self.input_strategy!r} "
                                          f"(dynamic={inputs.get('dynamic')})")  # fmt: skip
        self.input_group = inputs.get("group_size") if self.input_strategy == "group" else None
        if self.input_strategy == "group" and not (isinstance(self.input_group, int) and self.input_group > 0):
            raise unsupported(prefix, f"input strategy 'group' with group_size {self.input_group!r}")

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        if self.input_group and in_features % self.input_group:
            raise unsupported(self.prefix, f"input groups of {self.input_group} over {in_features} inputs")
        super().create_weights(layer, in_features, out_features, dtype)

    def gemm_runs_natively(self, weight: torch.Tensor) -> bool:
        """The FP8 GEMM quantizes inputs per token and 128 channels: only for the schemes that ask for that."""
        return self.input_group == GEMM_BLOCK[1] and super().gemm_runs_natively(weight)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.input_strategy is None or getattr(layer, "gemm_scales", None) is not None:
            return super().apply(layer, x, bias)
        weight = self.dequantized_weight(layer)
        groups = x.reshape(-1, x.shape[-1]).unflatten(-1, (-1, self.input_group or x.shape[-1]))
        quantized, scale = quantize_fp8_per_row(groups)  # one scale per token and group
        out = F.linear(dequantize(quantized, scale).flatten(-2), weight).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], weight.shape[0])
