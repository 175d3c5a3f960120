"""The RMSNorm and SiLU-and-mul that write their output as FP8 per token (Triton's interpreter on the CPU;
``tests/gpu`` routes an FP8 model's projections through them) give bit for bit what the unfused kernels and the
per-token quantization give in series: the FP8 values, their scales and the residual sum."""

import pytest
import torch

from brisk.layers.quantization.fp8_utils import quantize_fp8_per_row
from brisk.layers.quantization.triton_fp8_activation import (
    fuses_quantization,
    rms_norm_quantize_fp8,
    silu_and_mul_quantize_fp8,
)
from brisk.layers.triton_ops import rms_norm, silu_and_mul


def _activation(rows: int, width: int, seed: int) -> torch.Tensor:
    """bf16 rows whose magnitudes span six decades, one of them all zeros."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen) * torch.logspace(-3, 3, rows)[:, None]
    x[1] = 0.0
    return x.to(torch.bfloat16)


def _assert_same_fp8(q, scale, reference: torch.Tensor) -> None:
    q_ref, scale_ref = quantize_fp8_per_row(reference)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


@pytest.mark.parametrize("hidden", [96, 4096])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_quantize_equals_the_norm_then_the_quantization(hidden, with_residual):
    x = _activation(5, hidden, hidden)
    residual = _activation(5, hidden, hidden + 1) if with_residual else None
    weight = (1 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(7))).to(torch.bfloat16)
    q, scale, residual_out = rms_norm_quantize_fp8(x, weight, 1e-5, residual)
    if with_residual:
        normed, residual_ref = rms_norm(x, weight, 1e-5, residual)
        assert torch.equal(residual_out, residual_ref)
    else:
        normed = rms_norm(x, weight, 1e-5)
        assert residual_out is x
    _assert_same_fp8(q, scale, normed)


@pytest.mark.parametrize("d", [80, 14336])
def test_silu_and_mul_quantize_equals_the_activation_then_the_quantization(d):
    x = _activation(3, 2 * d, d)
    q, scale = silu_and_mul_quantize_fp8(x)
    _assert_same_fp8(q, scale, silu_and_mul(x))


def test_rows_wider_than_one_program_are_left_to_the_unfused_kernels():
    assert fuses_quantization(14336) and fuses_quantization(16384)
    assert not fuses_quantization(16385) and not fuses_quantization(28672)
