"""compressed-tensors WNA16 (``pack-quantized``: W4A16, W8A16): integer weights packed into int32 along the input
dimension (element ``i`` at bits ``i * num_bits``), a scale per output channel or per group of ``group_size``
inputs, a zero point per scale (asymmetric; packed along the output dimension); inputs stay unquantized.

On the CPU the weight is dequantized for each matmul (``(q - zero) * scale`` in float32, as compressed-tensors
does), so the computation equals the library's decompressed model. On CUDA 4-bit weights of bf16 models in groups
of 32 to 256 are repacked for PyTorch's tinygemm (``tinygemm.py``); the others stay as loaded for brisk's Triton
kernels, where one row goes to a GEMV that unpacks the words in registers, 2 to 16 rows to a tensor-core GEMV that
dequantizes each tile in registers, more rows multiply a dequantized copy with cuBLAS (``triton_int_gemm.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brisk.distributed.parallel_state import get_tp_size
from brisk.layers.quantization.base_config import add_param, check_group_size, replace_param
from brisk.layers.quantization.compressed_tensors.schemes import unsupported, weight_strategy
from brisk.layers.quantization.packed_int import kernel_linear, set_kernel_weights, unpack_int32, use_int_kernels

SUPPORTED_BITS = (2, 4, 8)  # whole values per int32 word


def unpack_signed(packed: torch.Tensor, num_bits: int, size: int, dim: int) -> torch.Tensor:
    """The packed unsigned values signed back (minus ``2 ** (num_bits - 1)``) and cut to ``size`` along ``dim``."""
    return (unpack_int32(packed, num_bits, dim).narrow(dim, 0, size) - (1 << (num_bits - 1))).to(torch.int8)


class CompressedTensorsWNA16:
    def __init__(self, weights: dict, prefix: str):
        self.prefix = prefix
        self.num_bits = weights.get("num_bits")
        if self.num_bits not in SUPPORTED_BITS:
            raise unsupported(prefix, f"{self.num_bits}-bit packed weights (supported: {SUPPORTED_BITS})")
        self.strategy = weight_strategy(weights, ("channel", "group"), prefix)
        self.group_size = weights.get("group_size") if self.strategy == "group" else None
        self.symmetric = weights.get("symmetric", True)

    def create_weights(self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        per_word = 32 // self.num_bits
        if in_features % per_word:
            raise unsupported(self.prefix, f"input size {in_features} (not a multiple of {per_word})")
        group = self.group_size or in_features
        check_group_size(f"compressed-tensors scheme of {self.prefix}", layer, group, in_features)
        groups = in_features // group
        add_param(
            layer,
            "weight_packed",
            torch.empty(out_features, in_features // per_word, dtype=torch.int32),
            output_dim=0,
            input_dim=1,
            packed_dim=1,
            packed_factor=per_word,
        )
        # Per-group scales split with the inputs; one per channel (strategy "channel") is every rank's.
        along_inputs = {"input_dim": 1} if self.strategy == "group" else {}
        add_param(layer, "weight_scale", torch.empty(out_features, groups, dtype=dtype), output_dim=0, **along_inputs)
        # The unpacked shape of each fused part: checked against the layer after loading. It starts as the layer's
        # own (random weights keep it: ``random_fill=False``), so only a checkpoint that says otherwise fails.
        shapes = torch.tensor([[size, in_features] for size in layer.output_partition_sizes], dtype=torch.int64)
        add_param(layer, "weight_shape", shapes, per_shard=True, random_fill=False)
        if not self.symmetric:
            for size in layer.output_partition_sizes:
                if size % per_word:
                    raise unsupported(self.prefix, f"asymmetric zero points of {size} outputs ({per_word} a word)")
            zero = torch.empty(out_features // per_word, groups, dtype=torch.int32)
            add_param(layer, "weight_zero_point", zero, output_dim=0, packed_dim=0, packed_factor=per_word,
                      **along_inputs)  # fmt: skip

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # The loader checked every packed tensor's shape; weight_shape (the unpacked one, per fused projection)
        # must agree. Under tensor parallelism it holds the unsharded shape, which the loader already checked.
        expected = [[size, layer.in_features] for size in layer.output_partition_sizes]
        if get_tp_size() == 1 and layer.weight_shape.tolist() != expected:
            raise ValueError(
                f"{self.prefix}: the checkpoint's weight_shape {layer.weight_shape.tolist()} does not match the "
                f"layer's {expected}."
            )
        # CUDA: tinygemm's layout where it takes the weight, else the packed words stay as loaded for the Triton
        # kernels (``packed_int.py``); unsigned zero points either way. Elsewhere: unpacked once, dequantized per
        # matmul.
        self.use_kernel = use_int_kernels(layer.weight_packed)
        zeros = None
        if not self.symmetric:
            zeros = unpack_signed(layer.weight_zero_point.data, self.num_bits, layer.out_features, dim=0)
        if self.use_kernel:
            from brisk.layers.quantization import tinygemm

            group, scales = self.group(layer), layer.weight_scale.data
            unsigned_zeros = None if zeros is None else (zeros.int() + (1 << (self.num_bits - 1))).contiguous()
            if tinygemm.takes(layer.out_features, layer.in_features, self.num_bits, group, scales):
                codes = unpack_int32(layer.weight_packed.data, self.num_bits, dim=1)
                set_kernel_weights(layer, codes, scales, unsigned_zeros, self.num_bits, group)
            elif unsigned_zeros is not None:
                replace_param(layer, "weight_zero_point", unsigned_zeros)
            return
        if zeros is not None:
            replace_param(layer, "weight_zero_point", zeros)
        qweight = unpack_signed(layer.weight_packed.data, self.num_bits, layer.in_features, dim=1)
        replace_param(layer, "weight_q", qweight)
        del layer.weight_packed

    def group(self, layer: nn.Module) -> int:
        """Inputs under one scale: the group size, or all of them (one scale per output channel)."""
        return self.group_size or layer.in_features

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        """``(q - zero) * scale`` per group, in the scale's dtype (compressed-tensors' ``dequantize``)."""
        scale = layer.weight_scale
        q = layer.weight_q.unflatten(-1, (scale.shape[1], -1)).to(scale.dtype)
        if not self.symmetric:
            q = q - layer.weight_zero_point.to(scale.dtype)[..., None]
        return (q * scale[..., None]).flatten(-2)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.use_kernel:
            return kernel_linear(layer, x, bias, self.num_bits, self.group(layer))
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)
