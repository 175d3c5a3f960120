"""Quantized GEMMs and the FP8 KV cache on a GPU (bf16, Llama-3.1-8B projection shapes) against the dequantized
references; the CPU tests cover the same code under emulation or the Triton interpreter. Written without a GPU
at hand: first runs may need their tolerances revisited, not their references."""

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from brisk.layers.quantization.fp8_utils import (  # noqa: E402
    dequantize,
    fp8_linear,
    has_fp8_tensor_cores,
    quantize_fp8_per_row,
)
from brisk.layers.quantization.triton_int_gemm import int_weight_gemm  # noqa: E402

DEV, BF16, HIDDEN = "cuda", torch.bfloat16, 4096


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


@pytest.mark.parametrize("rows", [1, 7, 256])
def test_scaled_mm_matches_the_emulated_fp8_gemm(rows):
    if not has_fp8_tensor_cores(torch.device(DEV)):
        pytest.skip("needs FP8 tensor cores (sm89+)")
    torch.manual_seed(0)
    x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
    qw, scale = quantize_fp8_per_row(0.02 * torch.randn(6144, HIDDEN, device=DEV, dtype=BF16))
    native = fp8_linear(x, qw, scale, None, None, native=True)
    if rows == 1:  # the weight-only FP8 GEMV: the input stays unquantized
        reference = F.linear(x.float(), dequantize(qw, scale))
    else:
        reference = fp8_linear(x, qw, scale, None, None, native=False)
    assert _rel_err(native, reference) < 1e-2  # the same products; bf16 output rounding and summation order


@pytest.mark.parametrize(("bits", "rows"), [(4, 1), (4, 16), (8, 1), (4, 256)])
def test_int_weight_gemm_matches_the_dequantized_weight(bits, rows):
    torch.manual_seed(1)
    out_features, group, per_word = 6144, 128, 32 // bits
    q = torch.randint(0, 2**bits, (out_features, HIDDEN), device=DEV, dtype=torch.int64)
    words = sum(q.view(out_features, -1, per_word)[..., j] << (bits * j) for j in range(per_word))
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    scales = (torch.rand(out_features, HIDDEN // group, device=DEV) * 0.01).to(BF16)
    zeros = torch.randint(0, 2**bits, scales.shape, device=DEV, dtype=torch.int32)
    weight = (q.float() - zeros.float().repeat_interleave(group, 1)) * scales.float().repeat_interleave(group, 1)
    x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
    out = int_weight_gemm(x, packed, scales, zeros, bits, group)
    assert _rel_err(out, F.linear(x.float(), weight)) < 2e-2
