"""Fused elementwise kernels for the GPU path: (residual add +) RMSNorm, rotary embedding, SiLU-and-mul.

Each replaces several small torch kernels by one launch, which is what separates a CUDA-graphed decode step
from the weight-read floor at small batch sizes. The torch versions in ``norm.py``, ``rotary.py`` and
``activation.py`` stay the reference (and the CPU path); tests compare the two in Triton's interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brisk.layers.pdl import pdl_launch_options, start_dependent_kernel


@triton.jit
def _embedding_kernel(ids_ptr, weight_ptr, out_ptr, hidden, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Program t copies the embedding row of token t."""
    start_dependent_kernel(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(ids_ptr + token).to(tl.int64)
    for start in range(0, hidden, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < hidden
        tl.store(out_ptr + token * hidden + cols, tl.load(weight_ptr + row * hidden + cols, mask=mask), mask=mask)


def embedding(input_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.embedding(input_ids, weight)``. Launched with PDL for one token, so that the first projection of a
    batch-1 decode step starts loading its weights while the row is copied (torch's gather does not let it)."""
    assert weight.is_contiguous()
    ids = input_ids.reshape(-1)
    hidden = weight.shape[1]
    out = torch.empty((ids.numel(), hidden), dtype=weight.dtype, device=weight.device)
    if ids.numel():
        _embedding_kernel[(ids.numel(),)](
            ids, weight, out, hidden, BLOCK=min(4096, triton.next_power_of_2(hidden)), num_warps=4,
            **pdl_launch_options(weight.device, ids.numel()),
        )  # fmt: skip
    return out.view(*input_ids.shape, hidden)


@triton.jit
def rms_norm_row(x_ptr, residual_ptr, weight_ptr, residual_out_ptr, row, x_stride, hidden, eps, cols, mask,
                 HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """Row ``row`` of ``norm(x + residual)`` in the activation dtype, storing ``x + residual`` where there is a
    residual; each step rounded to the activation dtype as the unfused torch ops store it. Shared with the norm
    that writes FP8 (``quantization/triton_fp8_activation.py``), so that both compute the same values."""
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * hidden + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like the unfused add
        tl.store(residual_out_ptr + row * hidden + cols, x, mask=mask)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, axis=0) / hidden
    normed = (xf * tl.rsqrt(variance + eps)).to(x.dtype)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    return (normed.to(tl.float32) * w.to(tl.float32)).to(x.dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    x_stride, hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    start_dependent_kernel(USE_PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    out = rms_norm_row(x_ptr, residual_ptr, weight_ptr, residual_out_ptr, row, x_stride, hidden, eps, cols, mask,
                       HAS_RESIDUAL)  # fmt: skip
    tl.store(out_ptr + row * hidden + cols, out, mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``RMSNorm.forward``: norm(x), or (norm(x + residual), x + residual)."""
    shape = x.shape
    hidden = shape[-1]
    x2 = x.reshape(-1, hidden)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, hidden), dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else out
    if rows:
        _rms_norm_kernel[(rows,)](
            x2, residual.reshape(-1, hidden) if residual is not None else x2, weight, out, residual_out,
            x2.stride(0), hidden, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden), num_warps=4,
            **pdl_launch_options(x.device, rows),
        )  # fmt: skip
    if residual is None:
        return out.view(shape)
    return out.view(shape), residual_out.view(shape)


@triton.jit
def rotary_factors(cos_ptr, sin_ptr, pos_ptr, token, trig_stride, HALF: tl.constexpr, HALF_P2: tl.constexpr):
    """cos and sin ([1, HALF_P2]) at this token's position, with the column offsets and mask they were read at."""
    pos = tl.load(pos_ptr + token)
    offs = tl.arange(0, HALF_P2)
    dmask = offs < HALF
    cos = tl.load(cos_ptr + pos * trig_stride + offs, mask=dmask, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * trig_stride + offs, mask=dmask, other=0.0)[None, :]
    return cos, sin, offs, dmask


@triton.jit
def rotate_heads(base_ptr, token_stride, head_stride, token, cos, sin, offs, dmask,
                  NUM_HEADS: tl.constexpr, HEADS_P2: tl.constexpr, HALF: tl.constexpr):  # fmt: skip
    """Rotate one token's heads in place; returns the rotated halves and their mask, for callers that also
    store them elsewhere (the KV cache)."""
    heads = tl.arange(0, HEADS_P2)
    mask = (heads[:, None] < NUM_HEADS) & dmask[None, :]
    ptrs = base_ptr + token * token_stride + heads[:, None] * head_stride + offs[None, :]
    x1 = tl.load(ptrs, mask=mask, other=0.0)
    x2 = tl.load(ptrs + HALF, mask=mask, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    r1 = (a * cos - b * sin).to(x1.dtype)
    r2 = (b * cos + a * sin).to(x1.dtype)
    tl.store(ptrs, r1, mask=mask)
    tl.store(ptrs + HALF, r2, mask=mask)
    return r1, r2, mask


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr,
    q_token_stride, q_head_stride, k_token_stride, k_head_stride, trig_stride,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, Q_HEADS_P2: tl.constexpr, K_HEADS_P2: tl.constexpr,
    HALF: tl.constexpr, HALF_P2: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """One program per token rotates all its query and key heads as [heads, dim/2] tiles."""
    start_dependent_kernel(USE_PDL)
    token = tl.program_id(0)
    cos, sin, offs, dmask = rotary_factors(cos_ptr, sin_ptr, pos_ptr, token, trig_stride, HALF, HALF_P2)
    rotate_heads(q_ptr, q_token_stride, q_head_stride, token, cos, sin, offs, dmask, NUM_Q_HEADS, Q_HEADS_P2, HALF)
    rotate_heads(k_ptr, k_token_stride, k_head_stride, token, cos, sin, offs, dmask, NUM_K_HEADS, K_HEADS_P2, HALF)


def apply_rotary(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query`` [tokens, heads, dim] and ``key`` [tokens, kv_heads, dim] in place (rotate-half layout)."""
    tokens, num_q_heads, dim = query.shape
    assert query.stride(-1) == 1 and key.stride(-1) == 1 and cos.is_contiguous()
    if tokens:
        _rotary_kernel[(tokens,)](
            query, key, cos, sin, positions,
            query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos.stride(0),
            NUM_Q_HEADS=num_q_heads, NUM_K_HEADS=key.shape[1], Q_HEADS_P2=triton.next_power_of_2(num_q_heads),
            K_HEADS_P2=triton.next_power_of_2(key.shape[1]), HALF=dim // 2, HALF_P2=triton.next_power_of_2(dim // 2),
            num_warps=4, **pdl_launch_options(query.device, tokens),
        )  # fmt: skip
    return query, key


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, x_stride, d, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    start_dependent_kernel(USE_PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # rounded like torch's silu before the product
    tl.store(out_ptr + row * d + cols, (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    out = torch.empty((x2.shape[0], d), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(d))
    if x2.shape[0]:
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
            x2, out, x2.stride(0), d, BLOCK=block, num_warps=4, **pdl_launch_options(x.device, x2.shape[0])
        )
    return out.view(*x.shape[:-1], d)
