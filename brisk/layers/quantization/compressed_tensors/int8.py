"""compressed-tensors W8A8 INT8 (``int-quantized``): int8 weights with per-channel or per-tensor scales, inputs
quantized to int8 per token at run time (or with a static per-tensor scale). Symmetric only, as llmcompressor's
W8A8 preset makes them.

CPU: the int8 arithmetic emulated exactly (quantize, dequantize, float32 matmul). CUDA: ``torch._int_mm`` with
int32 accumulation for more than 16 rows (written for the GPU, not run on the CPU test machine); up to 16 the
weight-only INT8 GEMVs of ``layers/fused.py``'s ``scaled_dense`` (small batches are bound by the weight's bytes,
and the input stays unquantized, as at FP8's one row), else the dequantized form."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.layers.fused import GEMV_MAX_ROWS, scaled_dense
from brisk.layers.quantization.compressed_tensors.schemes import (
    EightBitWeights,
    unsupported,
    weight_strategy,
)

INT8_MIN, INT8_MAX = -128, 127
INT8_HALF_RANGE = 127.5  # compressed-tensors' symmetric scale: max |x| / ((127 - -128) / 2)


def quantize_int8_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row to int8 with scale ``max |row| / 127.5`` (round half to even, clamp to [-128, 127])."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = torch.where(amax == 0, torch.finfo(torch.float32).eps, amax / INT8_HALF_RANGE)
    return quantize_int8(x, scale), scale


def quantize_int8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.round((x.float() / scale).clamp(INT8_MIN, INT8_MAX)).to(torch.int8)


class CompressedTensorsW8A8Int8(EightBitWeights):
    weight_dtype = torch.int8

    def __init__(self, weights: dict, inputs: dict, prefix: str):
        self.strategy = weight_strategy(weights, ("tensor", "channel"), prefix)
        if not weights.get("symmetric", True) or not inputs.get("symmetric", True):
            raise unsupported(prefix, "asymmetric INT8 weights or inputs")
        if inputs.get("type") != "int" or inputs.get("num_bits") != 8:
            raise unsupported(prefix, f"INT8 weights with {inputs.get('type')} {inputs.get('num_bits')}-bit inputs")
        dynamic, strategy = inputs.get("dynamic"), inputs.get("strategy")
        if (dynamic, strategy) not in ((True, "token"), (False, "tensor")):
            raise unsupported(prefix, f"INT8 input strategy {strategy!r} with dynamic={dynamic}")
        self.static_input = not dynamic

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.process_scales(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        out = scaled_dense(rows, layer.weight, layer.weight_scale, bias) if rows.shape[0] <= GEMV_MAX_ROWS else None
        if out is not None:
            return out.reshape(*x.shape[:-1], out.shape[-1])
        if self.static_input:
            x_scale = layer.input_scale.expand(rows.shape[0], 1)
            xq = quantize_int8(rows, layer.input_scale)
        else:
            xq, x_scale = quantize_int8_per_row(rows)
        if rows.is_cuda and rows.shape[0] > GEMV_MAX_ROWS:
            acc = torch._int_mm(xq, layer.weight.t()).float()
            out = (acc * x_scale * layer.weight_scale.reshape(1, -1)).to(x.dtype)
        else:
            out = F.linear(xq.float() * x_scale, layer.weight.float() * layer.weight_scale).to(x.dtype)
        if bias is not None:
            out = out + bias
        return out.reshape(*x.shape[:-1], out.shape[-1])
