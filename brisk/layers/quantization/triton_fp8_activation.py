"""The op before an FP8 GEMM writing its output as FP8 per token: (residual add +) RMSNorm, and SiLU-and-mul.

Above the GEMVs' rows, a projection with FP8 weights quantizes its input per token before ``torch._scaled_mm``
(``fp8_utils``): unfused, the norm or activation kernel writes the activation in bf16 and the quantizing kernel
reads it twice (its largest magnitude, then the values). Here one program holds a row in registers, computes the
op, its largest magnitude and its FP8 values, and writes those alone (and the residual sum): a launch and about
three of the activation's round trips through memory fewer, per norm and per gated MLP (on an H100, W1 with FP8
weights 10,701 against 10,238 output tok/s, one run each; ``docs/benchmarks.md``, thirty-third run). The
arithmetic is that of the two kernels in series (the norm's row is ``triton_ops.rms_norm_row``, the unfused
kernel's own): the op's output rounded to the activation dtype as it would be stored, then quantized as
``triton_fp8.quantize_fp8_rows`` does. Under Triton's interpreter the values are bit for bit those of the two
kernels; on an H100 some of the norm's values at 2,048 rows were not, before the row was shared (``tests/gpu``
bounds them against the exact values), while a model's tokens and prompt logprobs equalled those of the
unfused kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brisk.layers.quantization.triton_fp8 import fp8_scale, fp8_values
from brisk.layers.triton_gemv import _silu_and_mul
from brisk.layers.triton_ops import rms_norm_row

# The widest row one program holds (values in registers, 16 warps): the 8B shape's 14,336-wide MLP fits; wider
# rows take the two kernels in series.
MAX_FUSED_WIDTH = 16384


@triton.jit
def _store_fp8_row(x, q_row_ptr, scale_ptr, row, cols, mask):
    """One row ``x`` (float32 holding activation-dtype values, zeros past ``mask``) scaled by its largest
    magnitude over 448 and rounded to FP8, with ``quantize_fp8_rows``'s own arithmetic."""
    scale = fp8_scale(tl.max(tl.abs(x), axis=0))
    tl.store(scale_ptr + row, scale)
    tl.store(q_row_ptr + cols, fp8_values(x, scale).to(q_row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_quantize_kernel(
    x_ptr, residual_ptr, weight_ptr, q_ptr, scale_ptr, residual_out_ptr, x_stride, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    normed = rms_norm_row(x_ptr, residual_ptr, weight_ptr, residual_out_ptr, row, x_stride, hidden, eps, cols, mask,
                          HAS_RESIDUAL)  # fmt: skip
    _store_fp8_row(normed.to(tl.float32), q_ptr + row * hidden, scale_ptr, row, cols, mask)


@triton.jit
def _silu_and_mul_quantize_kernel(x_ptr, q_ptr, scale_ptr, x_stride, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0)
    _store_fp8_row(_silu_and_mul(gate, up).to(tl.float32), q_ptr + row * d, scale_ptr, row, cols, mask)


def fuses_quantization(width: int) -> bool:
    """Whether rows of ``width`` outputs fit one program of these kernels."""
    return triton.next_power_of_2(width) <= MAX_FUSED_WIDTH


def _launch_options(block: int) -> dict:
    return {"BLOCK": block, "num_warps": min(16, max(4, block // 1024))}


def rms_norm_quantize_fp8(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``norm(x + residual)`` of ``x [M, hidden]`` as FP8 with its float32 scales ``[M, 1]``, and ``x +
    residual`` (``x`` itself without ``residual``): ``triton_ops.rms_norm`` then ``quantize_fp8_rows``."""
    rows, hidden = x.shape
    assert x.stride(-1) == 1 and fuses_quantization(hidden), "rows of contiguous values that fit one program"
    q = torch.empty((rows, hidden), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    residual_out = torch.empty_like(x) if residual is not None else x
    if rows:
        _rms_norm_quantize_kernel[(rows,)](
            x, residual if residual is not None else x, weight, q, scale, residual_out, x.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, **_launch_options(triton.next_power_of_2(hidden)),
        )  # fmt: skip
    return q, scale, residual_out


def silu_and_mul_quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu(gate) * up`` of ``x = [gate | up]`` (``[M, 2 d]``) as FP8 with its float32 scales ``[M, 1]``:
    ``triton_ops.silu_and_mul`` then ``quantize_fp8_rows``."""
    rows, d = x.shape[0], x.shape[1] // 2
    assert x.stride(-1) == 1 and fuses_quantization(d), "rows of contiguous values that fit one program"
    q = torch.empty((rows, d), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if rows:
        block = triton.next_power_of_2(d)
        _silu_and_mul_quantize_kernel[(rows,)](x, q, scale, x.stride(0), d, **_launch_options(block))
    return q, scale
