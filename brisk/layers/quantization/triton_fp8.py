"""FP8 (E4M3) rounding and activation quantization in Triton: each row of an activation divided by its scale
(its largest magnitude over 448, per token; or a static per-tensor scale), saturated and rounded to nearest even,
in one kernel (the torch composition takes seven launches and float32 copies of the activation). The values of
``fp8_utils.quantize_fp8_per_row`` / ``quantize_fp8`` computed on the CPU (IEEE division; an H200 wrote +0 for
some tiny negative inputs where torch writes -0, and torch on that GPU divided some rows' maxima one float32 step
off)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX_MAGNITUDE: tl.constexpr = tl.constexpr(448.0)
MIN_SCALE: tl.constexpr = tl.constexpr(1e-12)  # as fp8_utils: an all-zero row still gets a usable scale


@triton.jit
def round_to_e4m3(x):
    """``x`` (float32 within +-448) rounded to the nearest float8_e4m3fn value, ties to even, in float32, so
    that the cast after it is exact. (Triton's interpreter, which the CPU tests run, casts by dropping bits
    without carrying into the exponent: 1.99 became 1.0.) Normal values keep 3 mantissa bits; below 2**-6 the
    spacing is the subnormals' 2**-9, rounded by the add-and-subtract of 1.5 * 2**23 on the magnitude."""
    bits = x.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    magnitude = tl.abs(x)
    subnormal = ((magnitude * 512.0 + 12582912.0) - 12582912.0) / 512.0
    return tl.where(magnitude < 0.015625, tl.where(bits < 0, -subnormal, subnormal), normal)  # keeps -0.0


@triton.jit
def fp8_scale(amax):
    """The per-token scale of a row whose largest magnitude is ``amax``: ``amax / 448`` (IEEE division, as torch
    divides), at least ``MIN_SCALE``."""
    return tl.maximum(tl.math.div_rn(amax, FP8_MAX_MAGNITUDE), MIN_SCALE)


@triton.jit
def fp8_values(x, scale):
    """``x`` (float32) over ``scale``, saturated and rounded to the nearest FP8 value (still float32, exact)."""
    return round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX_MAGNITUDE, FP8_MAX_MAGNITUDE))


@triton.jit
def _quantize_rows_kernel(
    x_ptr, q_ptr, scale_ptr, static_scale_ptr, K, stride_x, stride_q, groups, scale_group_stride,
    STATIC: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One program per row: its scale (a pass for the largest magnitude, unless ``STATIC``), then a pass that
    writes the FP8 values (IEEE division, as torch divides). Row ``r`` is group ``r % groups`` of token
    ``r // groups``; its scale goes to ``(r % groups) * scale_group_stride + r // groups``."""
    row = tl.program_id(0).to(tl.int64)
    x_row, q_row = x_ptr + row * stride_x, q_ptr + row * stride_q
    offs = tl.arange(0, BLOCK_K)
    if STATIC:
        scale = tl.load(static_scale_ptr)
    else:
        amax = tl.zeros([BLOCK_K], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = fp8_scale(tl.max(amax, axis=0))
        tl.store(scale_ptr + (row % groups) * scale_group_stride + row // groups, scale)
    for k0 in range(0, K, BLOCK_K):
        mask = k0 + offs < K
        x = tl.load(x_row + k0 + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(q_row + k0 + offs, fp8_values(x, scale).to(q_ptr.dtype.element_ty), mask=mask)


def quantize_fp8_rows(x: torch.Tensor, static_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` as FP8 and its float32 scales ``[M, 1]``: per row, or ``static_scale`` (one float32) for all."""
    assert x.dim() == 2 and x.stride(-1) == 1, "rows of contiguous values"
    rows, k = x.shape
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if static_scale is not None:
        scale = static_scale.reshape(1, 1).float().expand(rows, 1)
    else:
        scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device)
    if rows:
        _quantize_rows_kernel[(rows,)](
            x, q, scale, scale, k, x.stride(0), q.stride(0), 1, 0, STATIC=static_scale is not None,
            BLOCK_K=min(4096, triton.next_power_of_2(k)), num_warps=8,
        )  # fmt: skip
    return q, scale


def quantize_fp8_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (contiguous) as FP8 with a float32 scale per token and ``group`` channels, the scales
    ``[M, K / group]`` stored token-contiguous (column-major), the layout cuBLAS's block-scaled GEMM reads."""
    assert x.dim() == 2 and x.is_contiguous() and x.shape[1] % group == 0, "contiguous rows of whole groups"
    tokens, k = x.shape
    groups = k // group
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(groups, tokens, dtype=torch.float32, device=x.device).t()
    if tokens:
        _quantize_rows_kernel[(tokens * groups,)](
            x, q, scale, scale, group, group, group, groups, tokens, STATIC=False,
            BLOCK_K=triton.next_power_of_2(group), num_warps=4,
        )  # fmt: skip
    return q, scale
