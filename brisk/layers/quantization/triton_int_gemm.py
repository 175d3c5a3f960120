"""Triton weight-only integer GEMM: ``x @ W^T`` with ``W = (q - zero) * scale`` from packed 4- or 8-bit values, so
batch-1 decode reads a quarter (int4) or half (int8) of a projection's bf16 bytes.

Layout (compressed-tensors' ``pack-quantized``, kept as loaded): ``packed [N, K * bits / 32]`` int32, value ``k``
of a row at bits ``(k % per_word) * bits`` of word ``k // per_word``, unsigned (offset ``2 ** (bits - 1)``
for symmetric weights); ``scales [N, K / group]``; ``zeros [N, K / group]`` (unsigned, or None: the offset).
A GEMV serves one row (batch-1 decode); more rows dequantize the weight into the activation dtype and multiply
with cuBLAS.

Tested under ``TRITON_INTERPRET=1`` on the CPU and on an H200 (``tests/gpu``) against the dequantized
reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# The GEMV's (BLOCK_N, BLOCK_K, num_warps), from an H200 sweep of the 8B projections (benchmarks/tune_int_gemv.py),
# and the dequantizing kernel's (BLOCK_N, WORDS) tile (a lead, not yet measured).
GEMV_CONFIG = (8, 1024, 4)
DEQUANTIZE_TILE = (16, 64)


@triton.jit
def _dequantize_kernel(
    packed_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, stride_pn, stride_sn, stride_zn, stride_on,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr,
):  # fmt: skip
    """The weight ``[N, K]`` in the scales' dtype: each program unpacks a ``[BLOCK_N, WORDS]`` tile of packed
    words and writes its values as a ``[BLOCK_N, WORDS, values]`` tile (no reshape)."""
    per_word: tl.constexpr = 32 // BITS
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = tl.program_id(1) * WORDS + tl.arange(0, WORDS)
    mask = (offs_n < N)[:, None] & (offs_w < K // per_word)[None, :]
    words = tl.load(packed_ptr + offs_n[:, None].to(tl.int64) * stride_pn + offs_w[None, :], mask=mask, other=0)
    values = tl.arange(0, per_word)
    q = (words[:, :, None] >> (values * BITS)[None, None, :]) & ((1 << BITS) - 1)
    qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0  # see the GEMV
    group = (offs_w * per_word // GROUP)[None, :]
    scale = tl.load(scales_ptr + offs_n[:, None] * stride_sn + group, mask=mask, other=0.0)
    if HAS_ZEROS:
        zero = tl.load(zeros_ptr + offs_n[:, None] * stride_zn + group, mask=mask, other=0).to(tl.float32)
        qf = qf - zero[:, :, None]
    else:
        qf = qf - (1 << (BITS - 1))
    # (q - zero) * scale, exact in float32 and rounded once to the scales' dtype (as compressed-tensors' dequantize).
    w = qf * scale.to(tl.float32)[:, :, None]
    cols = offs_w[None, :, None] * per_word + values[None, None, :]
    ptrs = out_ptr + offs_n[:, None, None].to(tl.int64) * stride_on + cols
    tl.store(ptrs, w.to(out_ptr.dtype.element_ty), mask=mask[:, :, None])


def dequantize_packed(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int, group_size: int
) -> torch.Tensor:
    """The packed weight ``[N, K]`` (module docstring's layout) dequantized into the scales' dtype."""
    per_word = 32 // bits
    n, k = packed.shape[0], packed.shape[1] * per_word
    out = torch.empty(n, k, dtype=scales.dtype, device=packed.device)
    zeros_arg = zeros if zeros is not None else scales
    block_n, words = DEQUANTIZE_TILE
    _dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(packed.shape[1], words))](
        packed, scales, zeros_arg, out, n, k, packed.stride(0), scales.stride(0), zeros_arg.stride(0), out.stride(0),
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, BLOCK_N=block_n, WORDS=words,
    )  # fmt: skip
    return out


@triton.jit
def _int_weight_gemv_kernel(
    x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, stride_pn, stride_sn, stride_zn,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One row: each program owns ``BLOCK_N`` outputs and walks K, loading whole packed words (contiguous, each
    read once). A word's values meet their inputs as a ``[words, values]`` tile (no reshape), and the group's
    scale and zero point are applied once per word: ``(sum_j q_j x_j - zero * sum_j x_j) * scale``."""
    per_word: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // per_word
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    values = tl.arange(0, per_word)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_w = k0 // per_word + tl.arange(0, WORDS)
        w_mask = offs_w < K // per_word
        nw_mask = n_mask[:, None] & w_mask[None, :]
        words = tl.load(packed_ptr + offs_n[:, None].to(tl.int64) * stride_pn + offs_w[None, :], mask=nw_mask,
                        other=0)  # fmt: skip
        x = tl.load(x_ptr + offs_w[:, None] * per_word + values[None, :], mask=w_mask[:, None], other=0.0)
        x = x.to(tl.float32)  # [WORDS, per_word]
        q = (words[:, :, None] >> (values * BITS)[None, None, :]) & ((1 << BITS) - 1)
        # q as float without the (quarter-rate) int-to-float conversion: 2**23 + q has q in its mantissa bits.
        qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
        dots = tl.sum(qf * x[None, :, :], axis=2)  # [BLOCK_N, WORDS]
        group = (offs_w * per_word // GROUP)[None, :]
        scale = tl.load(scales_ptr + offs_n[:, None] * stride_sn + group, mask=nw_mask, other=0.0).to(tl.float32)
        if HAS_ZEROS:
            zero = tl.load(zeros_ptr + offs_n[:, None] * stride_zn + group, mask=nw_mask, other=0).to(tl.float32)
        else:
            zero = 1 << (BITS - 1)
        acc += tl.sum((dots - zero * tl.sum(x, axis=1)[None, :]) * scale, axis=1)
    tl.store(out_ptr + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def int_weight_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    group_size: int,
) -> torch.Tensor:
    """``x [..., K] @ W^T`` for the packed ``W [N, K]`` described in the module docstring."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    M, K = rows.shape
    N = packed.shape[0]
    if M == 1:  # batch-1 decode: weight-bound, no tensor-core tile to fill
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
        zeros_arg = zeros if zeros is not None else scales
        gemv_n, gemv_k, warps = GEMV_CONFIG
        _int_weight_gemv_kernel[(triton.cdiv(N, gemv_n),)](
            rows, packed, scales, zeros_arg, out, N, K, packed.stride(0), scales.stride(0), zeros_arg.stride(0),
            BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, BLOCK_N=gemv_n, BLOCK_K=gemv_k,
            num_warps=warps,
        )  # fmt: skip
        return out.reshape(*x.shape[:-1], N)
    # More rows: dequantize once into the activation dtype and let cuBLAS multiply (the weight's extra bytes are
    # read once for all rows; a kernel dequantizing inside the tensor-core loop redoes it per row tile).
    return F.linear(rows, dequantize_packed(packed, scales, zeros, bits, group_size).to(x.dtype)).reshape(
        *x.shape[:-1], N
    )
