"""Triton weight-only integer GEMM: ``x @ W^T`` with ``W = (q - zero) * scale`` dequantized in registers from
packed 4- or 8-bit values, so a projection reads a quarter (int4) or half (int8) of its bf16 bytes.

Layout (compressed-tensors' ``pack-quantized``, kept as loaded): ``packed [N, K * bits / 32]`` int32, value ``k``
of a row at bits ``(k % per_word) * bits`` of word ``k // per_word``, unsigned (offset ``2 ** (bits - 1)``
for symmetric weights); ``scales [N, K / group]``; ``zeros [N, K / group]`` (unsigned, or None: the offset).
One kernel serves every batch size (``BLOCK_M`` 16 at decode); tiles are leads to tune on a GPU.

Tested under ``TRITON_INTERPRET=1`` on the CPU against the dequantized reference; not yet run or measured on
a GPU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    block_m = 16 if M <= 16 else 64
    zeros_arg = zeros if zeros is not None else scales
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _int_weight_gemm_kernel[grid](
        rows, packed, scales, zeros_arg, out, M, N, K,
        rows.stride(0), packed.stride(0), scales.stride(0), zeros_arg.stride(0), out.stride(0),
        BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip
    return out.reshape(*x.shape[:-1], N)
