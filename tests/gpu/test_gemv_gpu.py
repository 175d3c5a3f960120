"""The decode GEMVs (one row, and a few) on a GPU in bf16 at Llama-3.1-8B projection shapes, against the unfused
layers; and a chain of them replayed from a CUDA graph (where programmatic dependent launch overlaps neighbours)
equal to eager runs."""

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from brisk.layers import triton_gemv, triton_gemv_rows, triton_ops  # noqa: E402

DEV, BF16, HIDDEN = "cuda", torch.bfloat16, 4096


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def test_8b_shaped_gemvs_close_to_cublas():
    torch.manual_seed(0)
    x = torch.randn(1, HIDDEN, device=DEV, dtype=BF16)
    residual = torch.randn(1, HIDDEN, device=DEV, dtype=BF16)
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=BF16) + 0.5
    w_qkv = 0.02 * torch.randn(6144, HIDDEN, device=DEV, dtype=BF16)
    w_down = 0.02 * torch.randn(HIDDEN, 14336, device=DEV, dtype=BF16)
    gate_up = torch.randn(1, 2 * 14336, device=DEV, dtype=BF16)
    bias = torch.randn(6144, device=DEV, dtype=BF16)

    out, summed = triton_gemv.rms_norm_gemv(x, residual, norm_w, 1e-5, w_qkv, bias)
    normed, ref_summed = triton_ops.rms_norm(x, norm_w, 1e-5, residual)
    assert torch.equal(summed, ref_summed)
    errors = {
        "rms_norm+qkv": _rel_err(out, F.linear(normed, w_qkv, bias)),
        "gemv": _rel_err(triton_gemv.gemv(x, w_qkv, None), F.linear(x, w_qkv)),
        "silu+down": _rel_err(
            triton_gemv.silu_and_mul_gemv(gate_up, w_down, None), F.linear(triton_ops.silu_and_mul(gate_up), w_down)
        ),
    }
    print(f"max error relative to the largest output {errors}")
    assert max(errors.values()) < 1e-2


def test_fused_chain_in_a_cuda_graph_equals_eager():
    """Eight layers of fused GEMVs: graph replays give the bits of an eager run, and close to the unfused layers."""
    torch.manual_seed(0)
    layers = [[0.02 * torch.randn(n, k, device=DEV, dtype=BF16) for n, k in ((6144, HIDDEN), (HIDDEN, HIDDEN),
              (2 * 14336, HIDDEN), (HIDDEN, 14336))] for _ in range(8)]  # fmt: skip
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=BF16) + 0.5
    x0 = torch.randn(1, HIDDEN, device=DEV, dtype=BF16)

    def fused() -> torch.Tensor:
        hidden, residual = x0, None
        for qkv_w, o_w, gate_up_w, down_w in layers:
            qkv, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, qkv_w, None)
            hidden = triton_gemv.gemv(qkv[:, :HIDDEN], o_w, None)
            gate_up, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, gate_up_w, None)
            hidden = triton_gemv.silu_and_mul_gemv(gate_up, down_w, None)
        return hidden + residual

    def unfused() -> torch.Tensor:
        hidden, residual = x0, x0
        normed = triton_ops.rms_norm(hidden, norm_w, 1e-5)
        for qkv_w, o_w, gate_up_w, down_w in layers:
            hidden = F.linear(F.linear(normed, qkv_w)[:, :HIDDEN], o_w)
            normed, residual = triton_ops.rms_norm(hidden, norm_w, 1e-5, residual)
            hidden = F.linear(triton_ops.silu_and_mul(F.linear(normed, gate_up_w)), down_w)
            normed, residual = triton_ops.rms_norm(hidden, norm_w, 1e-5, residual)
        return residual

    eager = fused()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fused()
    for _ in range(20):
        captured.zero_()
        graph.replay()
        assert torch.equal(captured, eager)
    error = _rel_err(eager, unfused())
    print(f"fused vs unfused, 8 layers: max difference {error:.2e} of the largest output")
    assert error < 5e-2  # bf16 roundings compound over the layers; a wrong kernel is off by the output's size


@pytest.mark.parametrize("rows", [2, 5, 16])
def test_8b_shaped_gemv_rows_close_to_cublas(rows):
    torch.manual_seed(rows)
    errors = {}
    for n, k in ((6144, HIDDEN), (HIDDEN, HIDDEN), (2 * 14336, HIDDEN), (HIDDEN, 14336)):
        x = torch.randn(rows, k, device=DEV, dtype=BF16)
        w = 0.02 * torch.randn(n, k, device=DEV, dtype=BF16)
        errors[f"{n}x{k}"] = _rel_err(triton_gemv_rows.gemv_rows(x, w, None), F.linear(x, w))
    print(f"{rows} rows: max error relative to the largest output {errors}")
    assert max(errors.values()) < 1e-2


def test_fp8_gate_up_ending_with_silu_and_mul_at_8b_shapes():
    """The FP8 MLP as one row runs it: the gate/up GEMV ending with SiLU-and-mul equals the ungated GEMV followed by
    the SiLU-and-mul kernel bit for bit (in a CUDA graph too), and the down GEMV in its 8-bit tiles is close to the
    product of the dequantized weight; a one-row weight compiles (Triton passes N == 1 as a constant)."""
    from brisk.layers.quantization.fp8_utils import dequantize, quantize_fp8_per_row

    torch.manual_seed(0)
    x, residual = torch.randn(1, HIDDEN, device=DEV, dtype=BF16), torch.randn(1, HIDDEN, device=DEV, dtype=BF16)
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=BF16) + 0.5
    gate_up_w, gate_up_scale = quantize_fp8_per_row(0.02 * torch.randn(2 * 14336, HIDDEN, device=DEV, dtype=BF16))
    down_w, down_scale = quantize_fp8_per_row(0.02 * torch.randn(HIDDEN, 14336, device=DEV, dtype=BF16))
    assert triton_gemv.fuses_silu_and_mul(*gate_up_w.shape, gate_up_w.element_size())

    def mlp() -> torch.Tensor:
        act, _ = triton_gemv.rms_norm_gemv(x, residual, norm_w, 1e-5, gate_up_w, None, gate_up_scale.view(-1),
                                           silu_and_mul=True)  # fmt: skip
        return act

    act = mlp()
    gate_up, _ = triton_gemv.rms_norm_gemv(x, residual, norm_w, 1e-5, gate_up_w, None, gate_up_scale.view(-1))
    assert torch.equal(act, triton_ops.silu_and_mul(gate_up))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mlp()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, act)
    down = triton_gemv.gemv(act, down_w, None, down_scale.view(-1))
    reference = act.double() @ dequantize(down_w, down_scale).double().T
    assert _rel_err(down, reference) < 1e-2
    one_row, _ = quantize_fp8_per_row(torch.randn(2, HIDDEN, device=DEV, dtype=BF16))
    single = triton_gemv.rms_norm_gemv(x, None, norm_w, 1e-5, one_row, None, torch.ones(2, device=DEV),
                                       silu_and_mul=True)[0]  # fmt: skip
    assert single.shape == (1, 1)
