"""Quantized GEMMs and the FP8 KV cache on a GPU (bf16, Llama-3.1-8B projection shapes) against the dequantized
references; the CPU tests cover the same code under emulation or the Triton interpreter. Written without a GPU
at hand: first runs may need their tolerances revisited, not their references."""

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from brisk.layers.fused import GEMV_MAX_ROWS  # noqa: E402
from brisk.layers.quantization.fp8_utils import (  # noqa: E402
    dequantize,
    fp8_linear,
    has_fp8_tensor_cores,
    quantize_fp8_per_row,
)
from brisk.layers.quantization.triton_fp8 import quantize_fp8_rows  # noqa: E402
from brisk.layers.quantization.triton_int_gemm import int_weight_gemm  # noqa: E402

DEV, BF16, HIDDEN = "cuda", torch.bfloat16, 4096


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _errors(out: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """Against a float64 ``exact``: the largest error over the largest magnitude, and the relative Frobenius
    norm ``||out - exact|| / ||exact||``."""
    diff = out.double() - exact
    return (diff.abs().max() / exact.abs().max()).item(), (diff.norm() / exact.norm()).item()


# Errors against the exact product of the operands. Rounding to bf16 (8 significant bits) errs by up to 2**-8 of
# each value: 1.7e-3 in the relative Frobenius norm for normally distributed outputs (2**-8 / sqrt(3) over a
# binade's RMS magnitude; 1.66e-3 measured here) and up to 2**-8 ~ 3.9e-3 of the largest output. FP8 tensor cores
# accumulate with fewer bits than float32 (about 14, by DeepSeek-V3's report on Hopper); torch's kernels add each
# few MMAs' sums into float32 registers unless asked for fast accumulation. On an H200 (tune_int_gemv.py) the
# native result erred as bf16 rounding alone does (1.66e-3, max 2.5e-3), and 2.1e-3 (max 5.5e-3) with fast
# accumulation, which brisk uses (8 to 10% faster GEMMs). FROBENIUS and MAX_ERROR hold either; a scale one FP8
# step off, or truncating to FP8 instead of rounding, puts the outputs about 6% off (measured on the CPU).
FROBENIUS, MAX_ERROR = 3e-3, 1e-2


@pytest.mark.parametrize("rows", [1, 7, 16, 17, 256])
def test_fp8_linear_matches_the_float64_product_of_its_fp8_operands(rows):
    """The native FP8 GEMM (``torch._scaled_mm`` with row-wise scales, bf16 out; up to 16 rows the weight-only FP8
    GEMVs, whose input stays unquantized) and the float32 emulation, each against the float64
    product of the dequantized FP8 operands it multiplies. The Triton quantization of ``_scaled_mm``'s input
    must hold the values of torch's on the CPU (on an H200 it wrote +0 for some tiny negative inputs where torch
    writes -0).
    The emulation quantizes with torch on the GPU, whose ``amax / 448`` was one float32 step off the IEEE
    quotient for some rows on an H200, so that a few ties (about 100 of 256 x 4096) round to the other FP8
    neighbour: compared with the native result, that read as a 1.1e-2 error. Its reference is the product of
    its own operands."""
    if not has_fp8_tensor_cores(torch.device(DEV)):
        pytest.skip("needs FP8 tensor cores (sm89+)")
    torch.manual_seed(0)
    x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
    qw, scale = quantize_fp8_per_row(0.02 * torch.randn(6144, HIDDEN, device=DEV, dtype=BF16))
    weight = dequantize(qw, scale).double()
    xq, x_scale = quantize_fp8_rows(x)
    cpu_q, cpu_scale = quantize_fp8_per_row(x.cpu())
    assert torch.equal(xq.cpu().float(), cpu_q.float()) and torch.equal(x_scale.cpu(), cpu_scale)
    native_input = x if rows <= GEMV_MAX_ROWS else dequantize(xq, x_scale)
    native_exact = F.linear(native_input.double(), weight)
    xq, x_scale = quantize_fp8_per_row(x)
    for name, out, exact in [
        ("native", fp8_linear(x, qw, scale, None, None, native=True), native_exact),
        (
            "emulated",
            fp8_linear(x, qw, scale, None, None, native=False),
            F.linear(dequantize(xq, x_scale).double(), weight),
        ),
    ]:
        max_error, frobenius = _errors(out, exact)
        assert frobenius < FROBENIUS and max_error < MAX_ERROR, (name, max_error, frobenius)


@pytest.mark.parametrize(
    ("bits", "rows", "group", "asymmetric"),
    [(4, 1, 128, True), (8, 1, 128, True), (4, 17, 128, True), (4, 256, 128, True),
     # the few-row GEMV: several groups a K step, one group a row (per channel), symmetric, 2-bit
     (4, 16, 128, True), (8, 7, 128, True), (4, 5, 32, True), (4, 8, HIDDEN, False), (8, 2, 64, False),
     (2, 12, 64, True)],
)  # fmt: skip
def test_int_weight_gemm_matches_the_dequantized_weight(bits, rows, group, asymmetric):
    torch.manual_seed(1)
    out_features, per_word = 6144, 32 // bits
    q = torch.randint(0, 2**bits, (out_features, HIDDEN), device=DEV, dtype=torch.int64)
    words = sum(q.view(out_features, -1, per_word)[..., j] << (bits * j) for j in range(per_word))
    packed = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    scales = (torch.rand(out_features, HIDDEN // group, device=DEV) * 0.01).to(BF16)
    zeros = torch.randint(0, 2**bits, scales.shape, device=DEV, dtype=torch.int32) if asymmetric else None
    signed_zeros = zeros.float() if asymmetric else torch.full(scales.shape, 2.0 ** (bits - 1), device=DEV)
    weight = (q.float() - signed_zeros.repeat_interleave(group, 1)) * scales.float().repeat_interleave(group, 1)
    x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
    out = int_weight_gemm(x, packed, scales, zeros, bits, group)
    assert _rel_err(out, F.linear(x.float(), weight)) < 2e-2


@pytest.mark.parametrize("rows", [1, 7, 16])
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_8bit_weight_gemvs_match_the_dequantized_weight(fmt, rows):
    """The weight-only 8-bit GEMVs (``fused.scaled_dense``) that W8A8 INT8 layers take up to 16 rows and FP8
    layers at one row (the few-row kernel takes FP8 weights too), against the float64 product of the
    unquantized input and the dequantized weight."""
    from brisk.layers.fused import scaled_dense
    from brisk.layers.quantization.compressed_tensors.int8 import quantize_int8_per_row

    torch.manual_seed(2)
    weight = 0.02 * torch.randn(6144, HIDDEN, device=DEV, dtype=BF16)
    qw, scale = quantize_fp8_per_row(weight) if fmt == "fp8" else quantize_int8_per_row(weight)
    x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
    out = scaled_dense(x, qw, scale)
    assert out is not None
    max_error, frobenius = _errors(out, F.linear(x.double(), dequantize(qw, scale).double()))
    assert frobenius < FROBENIUS and max_error < MAX_ERROR, (max_error, frobenius)


@pytest.mark.parametrize("group", [16, 32])
def test_fp4_dequantize_kernel_equals_the_torch_form(group):
    """The FP4 dequantizing kernel on the GPU against the torch form on the CPU, bit for bit in bf16, at the 8B
    gate/up shape."""
    from brisk.layers.quantization import triton_fp4
    from brisk.layers.quantization.compressed_tensors.fp4 import dequantize_fp4

    torch.manual_seed(3)
    packed = torch.randint(0, 256, (28672, HIDDEN // 2), dtype=torch.uint8)
    scales = torch.rand(28672, HIDDEN // group) * 0.01
    out = triton_fp4.dequantize_fp4(packed.to(DEV), scales.to(DEV), group, BF16)
    assert torch.equal(out.cpu(), dequantize_fp4(packed, scales, group, BF16))


@pytest.mark.parametrize(("n", "k"), [(64, 512), (40, 192), (24, 96)])  # 8, 4 and 2 k-tiles a load
def test_tinygemm_layout_is_the_one_the_dequantizing_kernel_reads(n, k):
    """PyTorch's ``_convert_weight_to_int4pack`` (through ``tinygemm.pack``) writes the layout that
    ``tests/quantization/test_tinygemm.py`` builds step by step and checks the dequantizing kernel against."""
    from brisk.layers.quantization import tinygemm
    from tests.quantization.test_tinygemm import tinygemm_layout

    torch.manual_seed(k)
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
    scales = torch.ones(n, k // 32, dtype=BF16, device=DEV)
    packed, _ = tinygemm.pack(codes.to(DEV), scales, None)
    assert torch.equal(packed.cpu(), tinygemm_layout(codes, tinygemm.inner_k_tiles(k)))


@pytest.mark.parametrize(("group", "asymmetric", "activation_order"),
                         [(32, False, False), (32, True, False), (128, False, False), (128, True, True)])  # fmt: skip
def test_tinygemm_int4_matches_the_dequantized_weight(group, asymmetric, activation_order):
    """The INT4 path of bf16 models (``packed_int.kernel_linear`` on tinygemm's layout), qkv shape: tinygemm at
    1, 5 and 16 rows and the dequantized weight with cuBLAS at 40, against the float64 product with the exact
    ``(q - zero) * scale``; the dequantizing kernel's bf16 weight equal to tinygemm's rounding of it; and with an
    activation order (GPTQ ``desc_act``: the groups gather inputs from anywhere), the inputs sorted by group."""
    from torch import nn

    from brisk.layers.quantization import tinygemm
    from brisk.layers.quantization.packed_int import kernel_linear, set_kernel_weights
    from tests.quantization.test_tinygemm import tinygemm_reference

    torch.manual_seed(group)
    n = 6144
    codes = torch.randint(0, 16, (n, HIDDEN), device=DEV, dtype=torch.int32)  # inputs in checkpoint order
    scales = (torch.rand(n, HIDDEN // group, device=DEV) * 0.01).to(BF16)
    zeros = torch.randint(0, 16, scales.shape, device=DEV, dtype=torch.int32) if asymmetric else None
    # Input i belongs to group g_idx[i]: in order, or shuffled; input_order sorts the inputs by group.
    g_idx = torch.arange(HIDDEN, device=DEV) // group
    if activation_order:
        g_idx = g_idx[torch.randperm(HIDDEN, device=DEV)]
    order = torch.sort(g_idx, stable=True).indices if activation_order else None
    layer = nn.Module()
    set_kernel_weights(layer, codes, scales, zeros, bits=4, group=group, input_order=order)
    assert not hasattr(layer, "weight_packed")
    signed = codes - (8 if zeros is None else zeros[:, g_idx])
    exact = signed.double() * scales.double()[:, g_idx]
    sz = layer.weight_scales_and_zeros
    sorted_codes = codes if order is None else codes[:, order]
    tinygemm_rounding = tinygemm_reference(sorted_codes, sz, group).to(BF16)
    assert torch.equal(tinygemm.dequantize(layer.weight_int4pack, sz, group), tinygemm_rounding)
    for rows in (1, 5, 16, 40):
        x = torch.randn(rows, HIDDEN, device=DEV, dtype=BF16)
        out = kernel_linear(layer, x, None, bits=4, group=group)
        max_error, frobenius = _errors(out, F.linear(x.double(), exact))
        assert frobenius < FROBENIUS and max_error < MAX_ERROR, (rows, max_error, frobenius)


# cuBLAS's block-scaled FP8 GEMM accumulates each block of 128 inputs at the tensor cores' precision before adding it
# in float32, with no option to do otherwise: on an H100 (thirty-first run) it erred by 3.2e-3 to 4.3e-3 in the
# relative Frobenius norm and 5.8e-3 to 8.9e-3 of the largest output from 3 rows up (one row: under 3e-3), against
# bf16 rounding's 1.7e-3. The test's block scales differ by up to 11 times, so a scale on the wrong block errs far more.
BLOCK_FROBENIUS, BLOCK_MAX_ERROR = 6e-3, 1.5e-2


@pytest.mark.parametrize("rows", [1, 3, 4, 37, 300])
@pytest.mark.parametrize("inputs", [1024, 1152])  # 8 blocks of inputs, and 9 (the scales padded to 12)
def test_block_fp8_gemm_matches_the_float64_product_of_its_fp8_operands(rows, inputs):
    """Block-wise FP8 (128 x 128 weight blocks) through cuBLAS's block-scaled GEMM: the input quantized per token
    and 128 channels, and the product against the float64 product of the same dequantized operands (the
    CPU's emulation of compressed-tensors' FP8_BLOCK). Token counts that are not multiples of 4 are padded, and
    K's blocks padded in the weight's scales."""
    from brisk.layers.quantization.block_fp8 import block_fp8_gemm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuBLAS scales FP8 blocks from sm90")
    torch.manual_seed(0)
    outputs = 768
    weight = (torch.randn(outputs, inputs, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    block_scales = torch.rand(outputs // 128, inputs // 128, device=DEV) * 1e-2 + 1e-3
    gemm_scales = F.pad(block_scales, (0, -block_scales.shape[1] % 4)).contiguous()
    x = torch.randn(rows, inputs, device=DEV, dtype=BF16)
    out = block_fp8_gemm(x, weight, gemm_scales, None)
    assert out.shape == (rows, outputs) and out.dtype == BF16
    groups = x.float().unflatten(-1, (-1, 128))
    xq, x_scale = quantize_fp8_per_row(groups)
    x_dequantized = dequantize(xq, x_scale).flatten(-2).double()
    w_dequantized = (weight.double().unflatten(0, (-1, 128)).unflatten(-1, (-1, 128))
                     * block_scales.double()[:, None, :, None]).flatten(-2).flatten(0, 1)  # fmt: skip
    largest, frobenius = _errors(out, x_dequantized @ w_dequantized.t())
    assert frobenius < BLOCK_FROBENIUS and largest < BLOCK_MAX_ERROR, (frobenius, largest)


@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("inputs", [1024, 5120])
def test_block_fp8_few_row_gemv_matches_the_float64_product(rows, inputs):
    """Block-wise FP8 through the few-row GEMV (block-wise FP8's batch-1 decode path), whose tiles each lie in one
    block and take its scale, against the float64 product of the bf16 input and the dequantized weight: bf16
    rounding alone (the input stays unquantized; fp16 products are exact for these inputs)."""
    from brisk.layers.triton_gemv_rows import gemv_rows

    torch.manual_seed(rows)
    outputs = 768
    weight = (torch.randn(outputs, inputs, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    block_scales = torch.rand(outputs // 128, inputs // 128, device=DEV) * 1e-2 + 1e-3
    x = torch.randn(rows, inputs, device=DEV, dtype=BF16)
    out = gemv_rows(x, weight, None, block_scales)
    w_dequantized = (weight.double().unflatten(0, (-1, 128)).unflatten(-1, (-1, 128))
                     * block_scales.double()[:, None, :, None]).flatten(-2).flatten(0, 1)  # fmt: skip
    largest, frobenius = _errors(out, x.double() @ w_dequantized.t())
    assert frobenius < FROBENIUS and largest < MAX_ERROR, (frobenius, largest)


@pytest.mark.parametrize("rows", [17, 256, 2048])
def test_fp8_inputs_written_by_the_norm_and_activation_hold_the_exact_values(rows):
    """The RMSNorm (with the residual add) and the SiLU-and-mul that write their outputs in FP8 per token, at the
    8B shape's widths: the residual sum bit for bit, and each value within its roundings of the float64 result
    (to bf16 twice, up to 2**-8 each, or a whole step of 2**-7 where Triton's interpreter truncates, which the
    CPU check of this bound ran; then to FP8 E4M3, up to 2**-4 of a normal value or half the subnormals' step of
    2**-9 times the row's scale). Under the interpreter they equal the unfused kernels bit for bit; on an H100
    the norm at 2,048 rows did not, before the two kernels shared their row code, hence the bound here."""
    if not has_fp8_tensor_cores(torch.device(DEV)):
        pytest.skip("needs FP8 tensor cores (sm89+)")
    from brisk.layers.quantization.triton_fp8_activation import rms_norm_quantize_fp8, silu_and_mul_quantize_fp8
    from brisk.layers.triton_ops import rms_norm

    def assert_within_roundings(q, scale, exact):
        value = q.double() * scale.double()
        assert torch.all((value - exact).abs() <= exact.abs() * (2**-4 + 2**-6 + 2**-9) + scale.double() * 2**-9)

    torch.manual_seed(rows)
    x, residual = (torch.randn(rows, HIDDEN, device=DEV, dtype=BF16) * 4 for _ in range(2))
    norm_weight = 1 + 0.1 * torch.randn(HIDDEN, device=DEV, dtype=BF16)
    q, scale, summed = rms_norm_quantize_fp8(x, norm_weight, 1e-5, residual)
    assert torch.equal(summed, rms_norm(x, norm_weight, 1e-5, residual)[1])  # the unfused kernel's sum
    s64 = summed.double()
    exact = s64 * torch.rsqrt(s64.square().mean(-1, keepdim=True) + 1e-5) * norm_weight.double()
    assert_within_roundings(q, scale, exact)
    gate_up = torch.randn(rows, 2 * 14336, device=DEV, dtype=BF16) * 3
    q, scale = silu_and_mul_quantize_fp8(gate_up)
    gate, up = gate_up.double().chunk(2, dim=-1)
    assert_within_roundings(q, scale, F.silu(gate) * up)
