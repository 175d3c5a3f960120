"""FP8 (float8_e4m3fn) quantization and the FP8 GEMM: on GPUs with FP8 tensor cores the weight-only FP8 GEMVs
up to 16 rows and ``torch._scaled_mm`` above, the same arithmetic emulated on the CPU (quantize, dequantize,
matmul in float32), weight-only dequantization on other GPUs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brisk.layers.fused import scaled_dense

FP8_DTYPE = torch.float8_e4m3fn
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # what a checkpoint's FP8 tensors may be stored as
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
_MIN_SCALE = 1e-12  # an all-zero row or token still gets a usable scale


def has_fp8_tensor_cores(device: torch.device) -> bool:
    """Ada (sm89), Hopper (sm90) and Blackwell have FP8 tensor cores; ``torch._scaled_mm`` needs them."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x / scale`` rounded to the nearest FP8 value (saturating at +-448), as compressed-tensors does."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def row_amax(x: torch.Tensor) -> torch.Tensor:
    """Each row's largest magnitude as float32, shape ``(rows, 1)``."""
    return x.abs().amax(dim=-1, keepdim=True).float()


def quantize_fp8_per_row(x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row scaled so its largest magnitude (``amax``, default :func:`row_amax`) maps to 448 (per output
    channel for a weight, per token for an activation); returns the FP8 tensor and the float32 scales, shape
    ``(rows, 1)``. A weight row split over ranks passes the whole row's ``amax``."""
    scale = ((row_amax(x) if amax is None else amax) / FP8_MAX).clamp(min=_MIN_SCALE)
    return quantize_fp8(x, scale), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    input_scale: torch.Tensor | None,
    native: bool,
) -> torch.Tensor:
    """``x W^T + b`` with FP8 ``weight`` (N, K) and float32 ``weight_scale`` (N, 1); the input is quantized per
    token (``input_scale`` None) or with the static per-tensor ``input_scale``. ``native``: ``torch._scaled_mm``
    (GPU with FP8 tensor cores), or up to 16 rows the weight-only FP8 GEMVs (the input stays unquantized);
    otherwise the same quantization with the product computed in float32."""
    rows = x.reshape(-1, x.shape[-1])
    if native:
        out = _native_fp8_linear(rows, weight, weight_scale, bias, input_scale).to(x.dtype)
    else:
        if input_scale is None:
            xq, x_scale = quantize_fp8_per_row(rows)
        else:
            xq, x_scale = quantize_fp8(rows, input_scale), input_scale.reshape(1, 1)
        out = F.linear(dequantize(xq, x_scale), dequantize(weight, weight_scale)).to(x.dtype)
        if bias is not None:
            out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _native_fp8_linear(
    rows: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    input_scale: torch.Tensor | None,
) -> torch.Tensor:
    """FP8 tensor cores: up to ``GEMV_MAX_ROWS`` rows (decode batches, speculative verification) go to the
    weight-only FP8 GEMVs (``fused.scaled_dense``), which read half of bf16's bytes and keep the input
    unquantized; at 2 to 16 rows the few-row GEMV multiplies in fp16 (``triton_gemv_rows``): on an H100 a layer's
    projections at 8 rows took 101 us against 145 for quantizing the input for ``torch._scaled_mm`` (twenty-third
    run). More rows are quantized in one Triton launch (bit for bit the torch quantization) and multiplied by
    ``torch._scaled_mm`` with row-wise scales, which writes bf16. It accumulates in the tensor cores' own
    precision between float32 updates ("fast accumulation"): on an H100 8 to 10% faster from 256 rows and W1 at
    10,240 tok/s against 9,781 (twenty-second run), at an error of 2.1e-3 of the outputs' norm against 1.66e-3
    (the bf16 rounding of the output alone; an H200, twentieth run, 4,096 inputs: the error grows with the input
    size)."""
    from brisk.layers.quantization.triton_fp8 import quantize_fp8_rows

    out = scaled_dense(rows, weight, weight_scale, bias)  # FP8 tensor cores imply the GEMVs' compute capability
    if out is not None:
        return out
    xq, x_scale = quantize_fp8_rows(rows.contiguous(), input_scale)
    return fp8_scaled_mm(xq, x_scale, weight, weight_scale, bias)


def fp8_scaled_mm(
    xq: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``(xq x_scale) (weight weight_scale)^T + bias`` in bf16 on FP8 tensor cores, for an input already in FP8
    with its float32 scales ``[M, 1]`` (per token, or one static scale expanded)."""
    out = torch._scaled_mm(
        xq, weight.t(), scale_a=x_scale.contiguous(), scale_b=weight_scale.reshape(1, -1), out_dtype=torch.bfloat16,
        use_fast_accum=True,
    )  # fmt: skip
    return out if bias is None else out + bias
