"""The one-kernel FP8 activation quantization (Triton's interpreter on the CPU; ``tests/gpu`` runs it through the
FP8 GEMM) gives bit for bit the torch quantization of the CPU, per token and with a static scale. (On an H200 it
equals that CPU result value for value, writing +0 for some tiny negative inputs where torch writes -0; torch on
the GPU computed some rows' ``amax / 448`` one float32 step off the IEEE quotient, which this kernel computes.)"""

import pytest
import torch

from brisk.layers.quantization.fp8_utils import quantize_fp8, quantize_fp8_per_row
from brisk.layers.quantization.triton_fp8 import quantize_fp8_groups, quantize_fp8_rows


@pytest.mark.parametrize(("rows", "k"), [(1, 96), (5, 4200), (3, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_torch_quantization(rows, k, dtype):
    gen = torch.Generator().manual_seed(rows * k)
    x = (torch.randn(rows, k, generator=gen) * torch.logspace(-4, 2, rows)[:, None]).to(dtype)
    x[0, :3] = 0.0
    if rows > 2:
        x[2] = 0.0  # an all-zero row takes the smallest scale
    q, scale = quantize_fp8_rows(x)
    q_ref, scale_ref = quantize_fp8_per_row(x)
    assert torch.equal(scale, scale_ref)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    static = torch.tensor([0.05])  # saturates the large rows
    q, scale = quantize_fp8_rows(x, static)
    assert torch.equal(q.view(torch.uint8), quantize_fp8(x, static).view(torch.uint8))
    assert scale.shape == (rows, 1) and torch.all(scale == 0.05)


@pytest.mark.parametrize(("tokens", "groups"), [(1, 1), (4, 3), (7, 2)])
def test_groups_match_the_torch_quantization_with_token_contiguous_scales(tokens, groups):
    """Per token and group of 128 channels (block-wise FP8's input): each group quantized as its own row, the
    scales ``[tokens, groups]`` laid out tokens first, the layout cuBLAS's block-scaled GEMM takes."""
    gen = torch.Generator().manual_seed(tokens * groups)
    x = torch.randn(tokens, groups * 128, generator=gen) * torch.logspace(-3, 2, groups).repeat_interleave(128)
    x = x.to(torch.bfloat16)
    q, scale = quantize_fp8_groups(x, 128)
    q_ref, scale_ref = quantize_fp8_per_row(x.reshape(-1, 128))
    assert scale.shape == (tokens, groups) and scale.stride() == (1, tokens)
    assert torch.equal(scale, scale_ref.reshape(tokens, groups))
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8).reshape(tokens, -1))
