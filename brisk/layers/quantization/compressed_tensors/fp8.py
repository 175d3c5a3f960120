"""compressed-tensors FP8 (``float-quantized``): FP8 weights with per-tensor or per-channel scales; inputs
quantized per token at run time (FP8_DYNAMIC), with a static per-tensor scale (FP8), or not at all
(weight-only FP8). On GPUs with FP8 tensor cores, up to 16 rows take the weight-only FP8 GEMVs whatever the
scheme's inputs (small batches are bound by the weight's bytes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.quantization.compressed_tensors.schemes import (
    EightBitWeights,
    unsupported,
    weight_strategy,
)
from brisk.layers.quantization.fp8_utils import FP8_DTYPE, dequantize, fp8_linear, has_fp8_tensor_cores


class CompressedTensorsW8A8Fp8(EightBitWeights):
    weight_dtype = FP8_DTYPE

    def __init__(self, weights: dict, inputs: dict | None, prefix: str):
        self.strategy = weight_strategy(weights, ("tensor", "channel"), prefix)
        self.static_input = False
        if inputs is not None:
            if inputs.get("type") != "float" or inputs.get("num_bits") != 8:
                raise unsupported(prefix, f"FP8 weights with {inputs.get('type')} {inputs.get('num_bits')}-bit inputs")
            if not inputs.get("symmetric", True):
                raise unsupported(prefix, "asymmetric FP8 input quantization")
            dynamic, strategy = inputs.get("dynamic"), inputs.get("strategy")
            if (dynamic, strategy) not in ((True, "token"), (False, "tensor")):
                raise unsupported(prefix, f"FP8 input strategy {strategy!r} with dynamic={dynamic}")
            self.static_input = not dynamic
        self.quantize_inputs = inputs is not None

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.process_scales(layer)
        self.native = has_fp8_tensor_cores(layer.weight.device)
        self.fp8_gemv = self.native  # batch-1 decode through the (fused) weight-only FP8 GEMV
        # more rows: inputs in FP8 per token (fused_linear may write them)
        self.fp8_per_token_input = self.native and self.quantize_inputs and not self.static_input

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.native and x.numel() == x.shape[-1]:  # one row: the weight-only FP8 GEMV, whatever the inputs
            return fp8_linear(x, layer.weight, layer.weight_scale, bias, None, self.native)
        if not self.quantize_inputs or (x.is_cuda and not self.native):  # weight-only FP8
            return F.linear(x, dequantize(layer.weight, layer.weight_scale).to(x.dtype), bias)
        input_scale = layer.input_scale if self.static_input else None
        return fp8_linear(x, layer.weight, layer.weight_scale, bias, input_scale, self.native)
