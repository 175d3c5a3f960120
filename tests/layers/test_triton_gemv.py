"""The Triton GEMV and its fused prologues match the unfused torch layers (Triton's interpreter on CPU)."""

import pytest
import torch
import torch.nn.functional as F

triton_gemv = pytest.importorskip("brisk.layers.triton_gemv")

from brisk.layers.activation import SiluAndMul  # noqa: E402
from brisk.layers.fused import gemv_ops_for  # noqa: E402
from brisk.layers.norm import RMSNorm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# (out features, in features): odd sizes leave partial output blocks and K tiles. Inputs of up to 4096 take the
# resident kernel, the input of 4200 the tiled kernel over three K tiles.
SHAPES = [(37, 96), (12, 4200)]
# 2,201 outputs are 1,101 blocks of 2: the resident kernel's 528 programs (4 per SM; the interpreter counts 132 SMs)
# walk two or three of them, so both of a program's tile slots are reloaded and the last block is partial.
WALKING = (2201, 40)


def _weights(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, k, device=DEVICE) / k**0.5, torch.randn(n, device=DEVICE)


@pytest.mark.parametrize(
    "n,k,with_bias", [(*shape, bias) for shape in SHAPES for bias in (False, True)] + [(*WALKING, True)]
)
def test_gemv_matches_linear(n, k, with_bias):
    torch.manual_seed(n + k)
    weight, bias = _weights(n, k)
    bias = bias if with_bias else None
    x = torch.randn(1, k + 8, device=DEVICE)[:, 3 : 3 + k]  # a view that starts inside its storage
    torch.testing.assert_close(triton_gemv.gemv(x, weight, bias), F.linear(x, weight, bias), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_gemv_matches_norm_then_linear(n, k, with_residual):
    torch.manual_seed(n * k)
    norm = RMSNorm(k, 1e-5, torch.float32).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    weight, bias = _weights(n, k)
    x = torch.randn(1, k, device=DEVICE)
    residual = torch.randn(1, k, device=DEVICE) if with_residual else None
    out, residual_out = triton_gemv.rms_norm_gemv(x, residual, norm.weight, norm.eps, weight, bias)
    summed = x + residual if with_residual else x
    torch.testing.assert_close(residual_out, summed)
    torch.testing.assert_close(out, F.linear(norm._norm(summed), weight, bias), atol=1e-4, rtol=1e-4)
    if with_residual:
        torch.testing.assert_close(residual, summed - x)  # the inputs are left as they were


@pytest.mark.parametrize("n,k", SHAPES)
def test_silu_and_mul_gemv_matches_activation_then_linear(n, k):
    torch.manual_seed(n + k)
    weight, bias = _weights(n, k)
    gate_up = torch.randn(1, 2 * k, device=DEVICE)
    expected = F.linear(SiluAndMul._reference(gate_up), weight, bias)
    torch.testing.assert_close(triton_gemv.silu_and_mul_gemv(gate_up, weight, bias), expected, atol=1e-4, rtol=1e-4)


def test_half_precision_rounds_like_the_unfused_ops():
    """In fp16 the prologue rounds where the separate kernels store, so only the matmul's order differs."""
    torch.manual_seed(0)
    k, n = 256, 64
    norm = RMSNorm(k, 1e-6, torch.float16).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    weight = (torch.randn(n, k, device=DEVICE) / k**0.5).half()
    x, residual = torch.randn(1, k, device=DEVICE).half(), torch.randn(1, k, device=DEVICE).half()
    out, residual_out = triton_gemv.rms_norm_gemv(x, residual, norm.weight, norm.eps, weight, None)
    normed, summed = norm(x, residual)
    assert torch.equal(residual_out, summed)
    expected = F.linear(normed.float(), weight.float())
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)


def test_gemv_is_chosen_only_for_one_row_on_a_gpu():
    if DEVICE == "cpu":
        assert gemv_ops_for(torch.zeros(1, 8)) is None  # the CPU path stays plain torch
        return
    assert gemv_ops_for(torch.zeros(1, 8, device=DEVICE)) is triton_gemv
    assert gemv_ops_for(torch.zeros(2, 8, device=DEVICE)) is None


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("fmt", ["fp8", "int8"])
def test_8bit_weight_gemv_matches_the_dequantized_weight(n, k, fmt):
    """FP8 or INT8 weights with a float32 scale per output row (weight-only at batch 1), fused prologue
    included."""
    from brisk.layers.quantization.compressed_tensors.int8 import quantize_int8_per_row
    from brisk.layers.quantization.fp8_utils import dequantize, quantize_fp8_per_row

    torch.manual_seed(n - k)
    weight, bias = _weights(n, k)
    qweight, scale = quantize_fp8_per_row(weight) if fmt == "fp8" else quantize_int8_per_row(weight)
    reference = dequantize(qweight, scale)
    x = torch.randn(1, k, device=DEVICE)
    out = triton_gemv.gemv(x, qweight, bias, scale.view(-1))
    torch.testing.assert_close(out, F.linear(x, reference, bias), atol=1e-4, rtol=1e-4)
    gate_up = torch.randn(1, 2 * k, device=DEVICE)
    out = triton_gemv.silu_and_mul_gemv(gate_up, qweight, None, scale.view(-1))
    torch.testing.assert_close(out, F.linear(SiluAndMul._reference(gate_up), reference), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k", [64, 4200])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_8bit_gemv_widens_every_value_exactly(k, dtype):
    """Row ``c`` of the weight holds 8-bit code ``c`` (e4m3's two NaN codes hold zero) and the input picks one
    column of it, so each output is one weight value times its scale, exact: for FP8 subnormals (codes 1 to 7),
    both zeros and the largest magnitude, for INT8 -128 to 127, in the resident and the tiled kernel."""
    codes = torch.arange(256, dtype=torch.int32)
    if dtype == torch.float8_e4m3fn:
        codes = torch.where((codes & 0x7F) == 0x7F, 0, codes)
    weight = codes.to(torch.uint8)[:, None].expand(256, k).contiguous().view(dtype).to(DEVICE)
    scale = torch.ldexp(torch.ones(256), torch.randint(-20, 20, (256,))).to(DEVICE)  # exact products
    x = torch.zeros(1, k, device=DEVICE)
    x[0, k // 3] = 1.0
    out = triton_gemv.gemv(x, weight, None, scale)
    assert torch.equal(out[0], weight[:, 0].float() * scale)


@pytest.mark.parametrize(
    "n,k,with_bias,fmt", [(37, 96, True, None), (WALKING[0], 40, False, None), (37, 96, True, "fp8")]
)
def test_gate_up_gemv_ending_with_silu_and_mul_matches_the_unfused_mlp(n, k, with_bias, fmt):
    """``rms_norm_gemv(..., silu_and_mul=True)`` over a ``[gate | up]`` weight of ``2 n`` rows gives ``silu(gate) *
    up`` of the unfused norm and projection: the walking shape reloads both tile slots, FP8 weights take the scale
    of row ``n + i`` for up ``i``, and a bias the same rows'."""
    from brisk.layers.quantization.fp8_utils import dequantize, quantize_fp8_per_row

    torch.manual_seed(n + k)
    norm = RMSNorm(k, 1e-5, torch.float32).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    weight, bias = _weights(2 * n, k)
    bias = bias if with_bias else None
    scale, reference = None, weight
    if fmt == "fp8":
        weight, scale = quantize_fp8_per_row(weight)
        reference, scale = dequantize(weight, scale), scale.view(-1)
    x, residual = torch.randn(1, k, device=DEVICE), torch.randn(1, k, device=DEVICE)
    out, residual_out = triton_gemv.rms_norm_gemv(x, residual, norm.weight, norm.eps, weight, bias, scale,
                                                  silu_and_mul=True)  # fmt: skip
    torch.testing.assert_close(residual_out, x + residual)
    expected = SiluAndMul._reference(F.linear(norm._norm(x + residual), reference, bias))
    assert out.shape == (1, n)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_gate_up_gemv_ending_with_silu_and_mul_rounds_like_the_unfused_ops():
    """In bf16 the gate and up values are rounded as the ungated GEMV stores them before the activation, so the
    fused epilogue gives exactly the ungated GEMV followed by the SiLU-and-mul kernel."""
    from brisk.layers import triton_ops

    torch.manual_seed(1)
    k, n = 256, 96
    norm_weight = torch.rand(k, device=DEVICE).add(0.5).bfloat16()
    weight = (torch.randn(2 * n, k, device=DEVICE) / k**0.5).bfloat16()
    bias = torch.randn(2 * n, device=DEVICE).bfloat16()
    x, residual = torch.randn(1, k, device=DEVICE).bfloat16(), torch.randn(1, k, device=DEVICE).bfloat16()
    out, _ = triton_gemv.rms_norm_gemv(x, residual, norm_weight, 1e-6, weight, bias, silu_and_mul=True)
    gate_up, _ = triton_gemv.rms_norm_gemv(x, residual, norm_weight, 1e-6, weight, bias)
    assert torch.equal(out, triton_ops.silu_and_mul(gate_up))


def test_gated_epilogue_is_taken_for_8bit_weights_whose_input_stays_resident():
    assert triton_gemv.fuses_silu_and_mul(2 * 14336, 4096, 1)  # Llama-3.1-8B's MLP, FP8 weights
    assert not triton_gemv.fuses_silu_and_mul(2 * 14336, 4096, 2)  # bf16: measured slower that way
    assert not triton_gemv.fuses_silu_and_mul(2 * 28672, 8192, 1)  # Llama-3.1-70B's: the tiled kernel's input
    # Its down projection then needs no prologue: 8-bit weights take tiles of bf16's bytes only then.
    assert triton_gemv.gemv_config(4096, 14336, 1, prologue=False).block_k == 2048
    assert triton_gemv.gemv_config(4096, 14336, 1, prologue=True).block_k == 1024
    assert triton_gemv.gemv_config(4096, 14336, 2, prologue=False).block_k == 1024


def test_llama_mlp_takes_the_gated_gemv_where_offered(monkeypatch):
    """The MLP's one-row path on a GPU, run here by handing ``fused_linear`` the GEMV module and offering the gated
    epilogue for float32 weights: its output and residual equal the CPU composition's, and the fused branch ran."""
    from types import SimpleNamespace

    from brisk.layers import fused_linear
    from brisk.models.llama import LlamaMLP

    torch.manual_seed(3)
    config = SimpleNamespace(hidden_size=64, intermediate_size=40, hidden_act="silu")
    mlp = LlamaMLP(config, torch.float32, True, None, "mlp").to(DEVICE)
    for param in mlp.parameters():
        param.data.normal_(0.0, 0.2)
    norm = RMSNorm(64, 1e-5, torch.float32).to(DEVICE)
    norm.weight.data.uniform_(0.5, 1.5)
    x, residual = torch.randn(1, 64, device=DEVICE), torch.randn(1, 64, device=DEVICE)
    expected, expected_residual = mlp(norm, x, residual)  # the composition (on a GPU: the ungated GEMVs)

    gated_calls = []

    def rms_norm_gemv(*args, silu_and_mul=False, **kwargs):
        gated_calls.append(silu_and_mul)
        return triton_gemv.rms_norm_gemv(*args, silu_and_mul=silu_and_mul, **kwargs)

    monkeypatch.setattr(fused_linear, "gemv_ops_for", lambda x: SimpleNamespace(
        fuses_silu_and_mul=lambda rows, k, weight_bytes: True, rms_norm_gemv=rms_norm_gemv))  # fmt: skip
    out, out_residual = mlp(norm, x, residual)
    assert gated_calls == [True]
    torch.testing.assert_close(out_residual, expected_residual)
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)
