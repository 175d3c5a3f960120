"""Integer weights packed into int32 words, and the form every integer format takes on a GPU.

GPTQ, AWQ and compressed-tensors pack 4- or 8-bit values differently; on CUDA each converts its checkpoint once,
at load time, into one of two layouts. 4-bit weights in bf16 models, in groups tinygemm reads, take PyTorch's
tinygemm layout (``tinygemm.py``): ``weight_int4pack`` and ``weight_scales_and_zeros``. The others take the one the
Triton kernels of ``triton_int_gemm.py`` read: ``weight_packed [N, K * bits / 32]`` int32 (values along the
inputs, low bits first), ``weight_scale [N, groups]`` in the model's dtype, ``weight_zero_point [N, groups]`` int32
(unsigned; absent when it is the midpoint ``2 ** (bits - 1)``). Either way ``input_order`` is there when the groups
follow an activation order (GPTQ ``desc_act``): the inputs are then sorted by group, and each matmul gathers its
input columns in that order."""

from __future__ import annotations

import torch
from torch import nn

from brisk.layers.quantization.base_config import replace_param


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned ``bits``-wide values packed low bits first along ``dim`` of an int32 tensor (as int16)."""
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)
    values = (packed.movedim(dim, -1)[..., None] >> shifts) & ((1 << bits) - 1)
    return values.flatten(-2).movedim(-1, dim).to(torch.int16)


def pack_int32(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Unsigned ``bits``-wide ``values`` packed low bits first along ``dim`` into int32 words."""
    per_word = 32 // bits
    moved = values.movedim(dim, -1).to(torch.int64).unflatten(-1, (-1, per_word))
    shifts = torch.arange(0, 32, bits, device=values.device, dtype=torch.int64)
    words = (moved << shifts).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).movedim(-1, dim).contiguous()


def use_int_kernels(weight: torch.Tensor) -> bool:
    """Whether a loaded integer weight goes to the Triton kernels: on CUDA (the CPU dequantizes each matmul in
    float32, exactly as the quantization libraries do)."""
    return weight.is_cuda


def set_kernel_weights(
    layer: nn.Module,
    weight_q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    group: int,
    input_order: torch.Tensor | None = None,
) -> None:
    """Register the kernels' layout on ``layer`` from unsigned values ``weight_q [N, K]`` (inputs in checkpoint
    order), ``scales`` and unsigned ``zeros`` ``[N, groups]`` (None: the midpoint) in groups of ``group`` inputs
    and, for an activation order, ``input_order`` (the inputs sorted by group). Parameters of the checkpoint's
    that share these names go. (Triton must be installed: tinygemm's module imports it.)"""
    from brisk.layers.quantization import tinygemm

    if input_order is not None:
        weight_q = weight_q[:, input_order]
        replace_param(layer, "input_order", input_order)
    for name in ("weight_packed", "weight_scale", "weight_zero_point"):
        if hasattr(layer, name):
            delattr(layer, name)
    if tinygemm.takes(*weight_q.shape, bits, group, scales):
        packed, scales_and_zeros = tinygemm.pack(weight_q, scales, zeros)
        replace_param(layer, "weight_int4pack", packed)
        replace_param(layer, "weight_scales_and_zeros", scales_and_zeros)
        return
    replace_param(layer, "weight_packed", pack_int32(weight_q, bits, dim=1))
    replace_param(layer, "weight_scale", scales.contiguous())
    if zeros is not None:
        replace_param(layer, "weight_zero_point", zeros.to(torch.int32).contiguous())


def kernel_linear(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None, bits: int, group: int) -> torch.Tensor:
    """``x W^T + b`` through tinygemm or the Triton kernels, for a layer set up by :func:`set_kernel_weights`."""
    from brisk.layers.quantization import tinygemm
    from brisk.layers.quantization.triton_int_gemm import int_weight_gemm

    if getattr(layer, "input_order", None) is not None:
        x = x.index_select(-1, layer.input_order)
    if hasattr(layer, "weight_int4pack"):
        out = tinygemm.linear(x, layer.weight_int4pack, layer.weight_scales_and_zeros, group)
    else:
        zeros = getattr(layer, "weight_zero_point", None)
        out = int_weight_gemm(x, layer.weight_packed, layer.weight_scale, zeros, bits, group)
    return out if bias is None else out + bias
