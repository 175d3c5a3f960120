"""``quantization="fp8"`` on a bf16/fp16/fp32 checkpoint: each linear layer's weight is quantized to FP8 once it
is loaded (a float32 scale per output channel) and its input per token at run time.

Under tensor parallelism each weight row keeps the scale it has on one rank (a row-parallel layer's ranks agree
on the row's largest magnitude), so every rank's FP8 weights are a slice of the single-rank ones. The inputs of
a row-parallel layer are quantized per token over this rank's slice of them, as vLLM does: one scale per
(token, rank) is finer than one per token, and agreeing on it would cost a collective per layer and step."""

from __future__ import annotations

import torch
from torch import nn

from brisk.distributed.parallel_state import tensor_model_parallel_all_reduce
from brisk.layers.linear import set_weight_attrs
from brisk.layers.quantization.base_config import QuantizationConfig
from brisk.layers.quantization.fp8_utils import fp8_linear, has_fp8_tensor_cores, quantize_fp8_per_row, row_amax


class Fp8Config(QuantizationConfig):
    name = "fp8"

    @classmethod
    def from_config(cls, config: dict) -> Fp8Config:
        # transformers' FineGrainedFP8 checkpoints also say quant_method "fp8": blocks of 128x128 FP8 values.
        if config.get("weight_block_size") is not None or config.get("is_checkpoint_fp8_serialized"):
            raise ValueError(
                "quantization_config quant_method 'fp8' with FP8 weights in the checkpoint (block-wise FP8) is not "
                "supported; brisk's 'fp8' quantizes bf16/fp16/fp32 checkpoints while loading."
            )
        return cls()

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Fp8OnlineLinearMethod:
        return Fp8OnlineLinearMethod()


class Fp8OnlineLinearMethod:
    """Loads the checkpoint's weight as is, then keeps only its FP8 form (per-output-channel scales). The GEMM
    quantizes the input per token: ``torch._scaled_mm`` on GPUs with FP8 tensor cores above 16 rows (up to 16,
    weight-only FP8 GEMVs that leave the input unquantized); on other GPUs the weight is dequantized for each
    call (weight-only FP8); on the CPU the FP8 arithmetic is emulated exactly."""

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        layer.weight = set_weight_attrs(weight, output_dim=0, input_dim=1)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        amax = row_amax(layer.weight.data)
        if layer.input_is_parallel:  # this rank holds part of each row: scale by the whole row, as one rank would
            amax = tensor_model_parallel_all_reduce(amax, op="max")
        qweight, scale = quantize_fp8_per_row(layer.weight.data, amax)
        layer.weight = nn.Parameter(qweight, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        self.native = has_fp8_tensor_cores(qweight.device)
        self.fp8_gemv = self.native  # batch-1 decode through the (fused) weight-only FP8 GEMV

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.is_cuda and not self.native:  # weight-only FP8 on GPUs without FP8 tensor cores
            weight = layer.weight.to(x.dtype) * layer.weight_scale.to(x.dtype)
            return torch.nn.functional.linear(x, weight, bias)
        return fp8_linear(x, layer.weight, layer.weight_scale, bias, None, self.native)
