"""FP4 (E2M1) weights dequantized on the GPU in one launch, straight into the activation dtype.

A packed FP4 weight is half a byte a value and its group scales (float32 here) a quarter more; held that way it
takes 0.75 bytes a weight against bf16's 2. Each matmul dequantizes it into a temporary in the input's dtype for
cuBLAS: this kernel reads the packed bytes and the scales once and writes each value once, where the torch form
(``compressed_tensors/fp4.py``'s ``unpack_fp4``) builds int64 codes and float32 values first. The arithmetic is
the torch form's: the E2M1 value (exact in float32) times its group's float32 scale, rounded once to the output
dtype, so the two agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _e2m1_value(code):
    """The float32 value of 4-bit E2M1 codes (bit 3 the sign, bits 1-2 the exponent, bit 0 the mantissa):
    0, 0.5 (the subnormal), 1, 1.5, 2, 3, 4, 6; built from comparisons, not ``exp2``, so exact on every GPU."""
    exponent = (code >> 1) & 3
    mantissa = (code & 1).to(tl.float32)
    power = tl.where(exponent == 3, 4.0, tl.where(exponent == 2, 2.0, 1.0))
    magnitude = tl.where(exponent == 0, 0.5 * mantissa, (1.0 + 0.5 * mantissa) * power)
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def _dequantize_fp4_kernel(
    packed_ptr, scales_ptr, out_ptr, N, PACKED_K, stride_pn, stride_sn, stride_on,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    """Program (row block, byte block): ``BLOCK_N`` rows x ``BLOCK_B`` packed bytes, each byte two values (the
    even one in the low nibble) of the same group (groups are even)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = (rows < N)[:, None] & (cols < PACKED_K)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    byte = tl.load(packed_ptr + rows64 * stride_pn + cols[None, :], mask=mask, other=0).to(tl.int32)
    scale = tl.load(scales_ptr + rows64 * stride_sn + (2 * cols // GROUP)[None, :], mask=mask, other=0.0)
    out = out_ptr + rows64 * stride_on + 2 * cols[None, :]
    dtype = out_ptr.dtype.element_ty
    tl.store(out, (_e2m1_value(byte & 0xF) * scale).to(dtype), mask=mask)
    tl.store(out + 1, (_e2m1_value(byte >> 4) * scale).to(dtype), mask=mask)


def dequantize_fp4(packed: torch.Tensor, scales: torch.Tensor, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """uint8 ``packed [N, K / 2]`` and float32 ``scales [N, K / group_size]`` to the ``dtype`` weight ``[N, K]``."""
    assert packed.dtype == torch.uint8 and scales.dtype == torch.float32 and group_size % 2 == 0
    assert packed.stride(-1) == 1 and scales.stride(-1) == 1, "the kernel reads rows as runs"
    n, packed_k = packed.shape
    out = torch.empty(n, 2 * packed_k, dtype=dtype, device=packed.device)
    block_n, block_b = 8, 128
    grid = (triton.cdiv(n, block_n), triton.cdiv(packed_k, block_b))
    _dequantize_fp4_kernel[grid](
        packed, scales, out, n, packed_k, packed.stride(0), scales.stride(0), out.stride(0),
        GROUP=group_size, BLOCK_N=block_n, BLOCK_B=block_b,
    )  # fmt: skip
    return out
