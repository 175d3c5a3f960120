"""Block-wise FP8 checkpoints in transformers' FineGrainedFP8 layout (``quant_method: "fp8"`` with
``weight_block_size``, the layout of DeepSeek-V3's and Qwen3's FP8 releases): FP8 (E4M3) weights ``[out, in]`` and
a float32 scale per block of ``[block_out, block_in]`` weights, ``weight_scale_inv`` (multiplied, despite its
name).

On the CPU, weight-only: each matmul dequantizes the weight block by block in float32, as transformers'
dequantizing load does, into the input's dtype, and leaves the input unquantized. On Hopper and later GPUs, blocks
of 128 x 128 in bf16/fp16 models are an FP8 GEMM (:func:`block_fp8_gemm`): the input quantized per token and 128
channels, as transformers' FP8 linear layer on a GPU and vLLM do, then cuBLAS's block-scaled FP8 matmul; one row
(batch-1 decode) takes the weight-only few-row GEMV instead, which reads the weight once and applies each block's
scale to its tile. Other blocks and older GPUs keep the weight-only emulation (every matmul pays for dequantizing
its weight). The weights stay in memory as FP8, a byte each plus a scale per block.

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
        """Where the FP8 GEMM runs, its copy of the scales: K's blocks padded to a multiple of 4 (cuBLAS's
        requirement), zero-padded (they multiply no value)."""
        scales = getattr(layer, self.scale_name)
        layer.gemm_scales = None
        if self.gemm_runs_natively(layer.weight):
            layer.gemm_scales = F.pad(scales.float(), (0, -scales.shape[1] % 4)).contiguous()

    def dequantized_weight(self, layer: nn.Module) -> torch.Tensor:
        """The weight in float32: each block times its scale."""
        blocks = layer.weight.float().unflatten(0, (-1, self.block_out)).unflatten(-1, (-1, self.block_in))
        return (blocks * getattr(layer, self.scale_name)[:, None, :, None]).flatten(-2).flatten(0, 1)

    def gemm_runs_natively(self, weight: torch.Tensor) -> bool:
        """Whether :func:`block_fp8_gemm` serves this layer: blocks of 128 x 128 on a CUDA GPU of compute capability
        9.0 or later, where cuBLAS scales FP8 blocks (and torch has ``scaled_mm``)."""
        return (
            (self.block_out, self.block_in) == GEMM_BLOCK
            and weight.device.type == "cuda"
            and torch.cuda.get_device_capability(weight.device) >= (9, 0)
            and hasattr(F, "scaled_mm")
        )

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Where the FP8 GEMM runs: one row (batch-1 decode) through the few-row GEMV, weight-only, whose tiles
        each lie in one block and take its scale (on an H100 W3 went from 212.6 to 225.8 tok/s against cuBLAS at
        rows padded to 4 after a quantization launch; at 4 rows cuBLAS stayed 1% ahead, thirty-second run); more
        rows through the GEMM. The one row is not quantized (as per-channel FP8's GEMVs leave it), so a request's
        logits at batch 1 differ slightly from the same request's in a batch, or in speculative verification; and
        beside bf16 the GEMV multiplies in fp16, whose range (+-65504) clamps larger inputs (``triton_gemv_rows``).
        Elsewhere weight-only: the input as it is, times the dequantized weight."""
        if getattr(layer, "gemm_scales", None) is not None and x.dtype in (torch.bfloat16, torch.float16):
            if x.numel() == x.shape[-1]:
                from brisk.layers.triton_gemv_rows import gemv_rows

                out = gemv_rows(x.reshape(1, -1), layer.weight, bias, getattr(layer, self.scale_name))
                return out.reshape(*x.shape[:-1], out.shape[-1])
            return block_fp8_gemm(x, layer.weight, layer.gemm_scales, bias)
        return F.linear(x, self.dequantized_weight(layer).to(x.dtype), bias)


GEMM_BLOCK = (128, 128)  # the weight blocks cuBLAS's block-scaled FP8 GEMM takes (inputs: 1 x 128)


def block_fp8_gemm(
    x: torch.Tensor, weight: torch.Tensor, gemm_scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ weight^T`` for 128 x 128 weight blocks: ``x`` quantized per token and 128 channels in one Triton
    launch (bit for bit ``fp8_utils.quantize_fp8_per_row`` on each group), then ``torch.nn.functional.scaled_mm``
    (cuBLAS) with both scales, writing ``x``'s dtype. cuBLAS takes the token count in multiples of 4 (zero rows
    pad it) and the input scales with the tokens contiguous, as the quantization writes them; ``gemm_scales`` is
    ``[out / 128, in / 128]`` with its columns padded to a multiple of 4."""
    from brisk.layers.quantization.triton_fp8 import quantize_fp8_groups

    rows = x.reshape(-1, x.shape[-1])
    count = rows.shape[0]
    padded = F.pad(rows, (0, 0, 0, -count % 4)) if count % 4 else rows.contiguous()
    quantized, scales = quantize_fp8_groups(padded, GEMM_BLOCK[1])
    out = F.scaled_mm(
        quantized, weight.t(), scales, F.ScalingType.BlockWise1x128, gemm_scales.t(), F.ScalingType.BlockWise128x128,
        output_dtype=x.dtype,
    )[:count]  # fmt: skip
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class BlockFp8LinearMethod(BlockFp8Weights):
    """transformers' FineGrainedFP8 layout."""

    scale_name = "weight_scale_inv"
