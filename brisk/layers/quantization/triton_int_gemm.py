"""Triton weight-only integer GEMM: ``x @ W^T`` with ``W = (q - zero) * scale`` dequantized in registers from
packed 4- or 8-bit values, so a projection reads a quarter (int4) or half (int8) of its bf16 bytes.

Layout (compressed-tensors' ``pack-quantized``, kept as loaded): ``packed [N, K * bits / 32]`` int32, value ``k``
of a row at bits ``(k % per_word) * bits`` of word ``k // per_word``, unsigned (offset ``2 ** (bits - 1)``
for symmetric weights); ``scales [N, K / group]``; ``zeros [N, K / group]`` (unsigned, or None: the offset).
A GEMV serves one row (batch-1 decode), a tensor-core GEMM every other batch size.

Tested under ``TRITON_INTERPRET=1`` on the CPU and on an H200 (``tests/gpu``) against the dequantized
reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The GEMV's (BLOCK_N, BLOCK_K, num_warps): a lead, to be tuned on a GPU (benchmarks/tune_int_gemv.py).
GEMV_CONFIG = (8, 1024, 4)


@triton.jit
def _int_weight_gemm_kernel(
    x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
    stride_xm, stride_pn, stride_sn, stride_zn, stride_om,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    per_word: tl.constexpr = 32 // BITS
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0)  # fmt: skip
        w_mask = n_mask[:, None] & k_mask[None, :]
        # Each word is read once per value it holds (the repeats hit the cache), then shifted to that value.
        words = tl.load(packed_ptr + offs_n[:, None] * stride_pn + (offs_k // per_word)[None, :], mask=w_mask,
                        other=0)  # fmt: skip
        q = (words >> ((offs_k % per_word) * BITS)[None, :]) & ((1 << BITS) - 1)
        group = (offs_k // GROUP)[None, :]
        scale = tl.load(scales_ptr + offs_n[:, None] * stride_sn + group, mask=w_mask, other=0.0).to(tl.float32)
        if HAS_ZEROS:
            zero = tl.load(zeros_ptr + offs_n[:, None] * stride_zn + group, mask=w_mask, other=0).to(tl.float32)
        else:
            zero = 1 << (BITS - 1)
        w = ((q.to(tl.float32) - zero) * scale).to(x.dtype)  # [BLOCK_N, BLOCK_K]
        acc += tl.dot(x, tl.trans(w), input_precision="ieee" if x.dtype == tl.float32 else "tf32")
    out_mask = m_mask[:, None] & n_mask[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


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
    *,
    block_n: int = 64,
    block_k: int = 64,
) -> torch.Tensor:
    """``x [..., K] @ W^T`` for the packed ``W [N, K]`` described in the module docstring."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    M, K = rows.shape
    N = packed.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    zeros_arg = zeros if zeros is not None else scales
    if M == 1:  # batch-1 decode: weight-bound, no tensor-core tile to fill
        gemv_n, gemv_k, warps = GEMV_CONFIG
        _int_weight_gemv_kernel[(triton.cdiv(N, gemv_n),)](
            rows, packed, scales, zeros_arg, out, N, K, packed.stride(0), scales.stride(0), zeros_arg.stride(0),
            BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, BLOCK_N=gemv_n, BLOCK_K=gemv_k,
            num_warps=warps,
        )  # fmt: skip
        return out.reshape(*x.shape[:-1], N)
    block_m = 16 if M <= 16 else 64
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _int_weight_gemm_kernel[grid](
        rows, packed, scales, zeros_arg, out, M, N, K,
        rows.stride(0), packed.stride(0), scales.stride(0), zeros_arg.stride(0), out.stride(0),
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return out.reshape(*x.shape[:-1], N)
