"""Triton GEMV for a few rows: the projections of small decode batches and of speculative verification.

At 2 to ``GEMV_MAX_ROWS`` rows a projection is still a read of its weights: the rows reuse each weight tile from
registers, so the time is the weight bytes over the bandwidth the kernel keeps up. cuBLAS picks tiles for
matrices and reads the 8B shape's attention projections at 2.5 to 3.3 TB/s on the H200; this kernel reads them
at 3.0 to 3.5 (``benchmarks/tune_gemv_rows.py``). The weight is the tensor core's left operand (``W_tile @
x_tile^T``), so its rows fill the tile's 64 rows and the input rows only the narrow side, padded to 16; each
program owns ``BLOCK_N`` outputs of every row and streams its weight rows through K in pipelined tiles.

FP8 and INT8 weights (``float8_e4m3fn`` or ``int8``, a float32 scale per output row, as ``quantization="fp8"``
and compressed-tensors' FP8 and W8A8 keep them) are widened in registers (exactly: both fit in 16 bits) and the
scale is applied to each output: weight-only 8-bit, which reads half of bf16's bytes and leaves the input
unquantized, as the one-row GEMV does. Beside bf16 inputs FP8 tiles are multiplied in fp16: FP8 widens to fp16 in
one instruction a pair of values, to bf16 only through float32, and that conversion bound the kernel (on an H100
at 8 rows the four 8B projections of a layer took 164 us widened to bf16, 101 in fp16, against 157 for bf16
weights and 145 for quantizing the input for ``torch._scaled_mm``: ``tune_gemv_rows.py --fp8-rows``,
twenty-third run). The inputs are clamped to fp16's range (+-65504) first; within it a bf16 value is an fp16
value (fp16 has the more mantissa bits), so the products are the bf16 inputs' own, unless an input is beyond
65504 or below fp16's normal range (6e-5), which float16 rounds to its subnormals' 6e-8 steps. INT8 tiles keep
the input's dtype: in fp16 they were slower than bf16 weights (170 against 153 us a layer at 8 rows; INT8 widens
to fp16 one value an instruction, at a quarter of the arithmetic rate). Block-wise FP8 (a scale per block of
weights) keeps each tile within one block and adds the tile's product times its scale; it takes this kernel at one
row, where it beat cuBLAS's block-scaled GEMM (``quantization/block_fp8.py``).

Unlike the one-row GEMV (``triton_gemv.py``) it fuses no prologue: an RMSNorm or SiLU computed inside the
kernel is computed again by every program, which for 16 rows cost more than the separate kernel's round trip
(the fused stack of 32 layers took 6.8 ms against 4.2 with cuBLAS, on the same run).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from brisk.layers.device_limits import num_sms, shared_memory_per_block


@triton.jit
def _gemv_rows_kernel(
    x_ptr, weight_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, x_stride, weight_stride, scale_stride,
    HAS_SCALE: tl.constexpr, SCALE_BLOCK_N: tl.constexpr, SCALE_BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FP16_PRODUCTS: tl.constexpr, K_PER_SPLIT, SPLIT_K: tl.constexpr,
):  # fmt: skip
    """One program per ``BLOCK_N`` outputs of every row and slice of ``K_PER_SPLIT`` inputs: ``out[:, n] = x @
    W[n, :]^T`` (times ``scale[n]`` with ``HAS_SCALE``); with ``FP16_PRODUCTS`` the tiles are multiplied in fp16.
    With ``SCALE_BLOCK_K`` the weight has a scale per ``SCALE_BLOCK_N x SCALE_BLOCK_K`` block (block-wise FP8),
    and each tile, which lies in one block, adds its product times its block's scale. With ``SPLIT_K`` slices
    each program stores its float32 partial sums, ``[SPLIT_K, M, N]``, for ``_sum_splits_kernel`` (the bias, and
    a per-row scale, come there)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < M
    n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    k_start, k_end = 0, K
    if SPLIT_K > 1:
        k_start = split * K_PER_SPLIT
        k_end = tl.minimum(K, k_start + K_PER_SPLIT)
    for k0 in range(k_start, k_end, BLOCK_K):
        cols = k0 + offs_k
        col_mask = cols < K
        w = tl.load(weight_ptr + n[:, None].to(tl.int64) * weight_stride + cols[None, :],
                    mask=n_mask[:, None] & col_mask[None, :], other=0.0)  # fmt: skip
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=row_mask[:, None] & col_mask[None, :],
                    other=0.0)  # fmt: skip
        if FP16_PRODUCTS:  # FP8 weights beside bf16 inputs: both widened to fp16 (module docstring)
            x = tl.clamp(x.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
            w = w.to(tl.float16)
        else:
            w = w.to(x.dtype)
        if SCALE_BLOCK_K:
            block_scale = tl.load(scale_ptr + (pid * BLOCK_N // SCALE_BLOCK_N) * scale_stride + k0 // SCALE_BLOCK_K)
            acc += tl.dot(w, tl.trans(x), input_precision=DOT_PRECISION) * block_scale
        else:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
    if SPLIT_K > 1:
        tl.store(out_ptr + split * M * N + rows[None, :] * N + n[:, None], acc,
                 mask=row_mask[None, :] & n_mask[:, None])  # fmt: skip
    else:
        if HAS_SCALE:
            acc *= tl.load(scale_ptr + n, mask=n_mask, other=0.0)[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + rows[None, :] * N + n[:, None], acc.to(out_ptr.dtype.element_ty),
                 mask=row_mask[None, :] & n_mask[:, None])  # fmt: skip


@triton.jit
def _sum_splits_kernel(partial_ptr, scale_ptr, bias_ptr, out_ptr, M, N, HAS_SCALE: tl.constexpr,
                       HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """``out = sum(partial, 0) * scale + bias`` over ``BLOCK`` of the ``M * N`` outputs, the slices summed in
    order (the same bits run to run, unlike atomic adds)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.load(partial_ptr + offs, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLIT_K):
        acc += tl.load(partial_ptr + split * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_SCALE:
        acc *= tl.load(scale_ptr + n, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


class GemvRowsConfig(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # slices of K in programs of their own, summed by a second kernel


# Shared memory a launch needs beyond its pipelined tiles: Hopper keeps one weight and one input tile a stage
# (160 KiB for four stages of 64 x 256 and 16 x 256 bf16, compiled for sm_90), Ampere and Ada one stage fewer.
SHARED_MEMORY_MARGIN = 4096
MAX_STAGES = 4


def block_m(rows: int) -> int:
    """The input rows padded to the tensor core's narrow side: a power of two, 16 at least."""
    return max(16, triton.next_power_of_2(rows))


@functools.cache
def gemv_rows_config(
    rows: int,
    element_size: int = 2,
    shared_memory: int = 0,
    weight_element_size: int | None = None,
    fp16_products: bool = False,
    inputs: int = 0,
    outputs: int = 0,
    multiprocessors: int = 0,
    scale_block: tuple[int, int] = (0, 0),
) -> GemvRowsConfig:
    """Measured on an H200 (``benchmarks/tune_gemv_rows.py``, Llama-3.1-8B projections at 4 and 16 rows, bf16):
    64 outputs by 256 inputs a tile, four stages in flight, was the best single choice over the four projections
    at both row counts (within 3% of each projection's own best). Float32 takes tiles of the same bytes (128
    inputs). FP8 weights multiplied in fp16 (``fp16_products``) take 32 outputs by the input's 256: on an H100 at
    4, 8 and 16 rows 98 to 101 us for a layer's four projections against 113 to 117 with 64 outputs (twice the
    programs, each with half the widening to do; 512 inputs were as fast, 16 outputs or two warps slower). A GPU
    with less ``shared_memory`` a block (bytes; 0: no limit, the interpreter) keeps fewer stages, and below two
    halves the tiles' inputs. ``element_size`` is the input's, ``weight_element_size`` the weight's (default: the
    same). Cached: an eager step asks once a projection.

    A projection of few ``outputs`` and many ``inputs`` (a small model's down projection) leaves most of the
    ``multiprocessors`` idle, so its K is split (``split_k_for``). Weights with a scale per ``scale_block``
    (block-wise FP8, :func:`scale_blocks`) take tiles of at most the largest powers of two that divide the block,
    so that each tile lies in one block."""
    weight_size = weight_element_size or element_size
    block_n = 32 if fp16_products else 64
    block_k = 512 // element_size
    if scale_block[0]:
        block_n, block_k = (min(tile, size & -size) for tile, size in zip((block_n, block_k), scale_block))
        assert block_n >= 16 and block_k >= 16, f"blocks of {scale_block} leave tiles under the tensor core's 16"
    stages = MAX_STAGES
    while shared_memory:
        stage_bytes = (block_n * weight_size + block_m(rows) * element_size) * block_k
        stages = min(MAX_STAGES, (shared_memory - SHARED_MEMORY_MARGIN) // stage_bytes)
        if stages >= 2 or block_k == 32:
            break
        block_k //= 2
    split_k = split_k_for(inputs, outputs, block_n, block_k, multiprocessors)
    return GemvRowsConfig(block_n, block_k, num_warps=4, num_stages=max(stages, 1), split_k=split_k)


def split_k_for(inputs: int, outputs: int, block_n: int, block_k: int, multiprocessors: int) -> int:
    """Slices of K for a launch of ``cdiv(outputs, block_n)`` programs that fill under a quarter of the
    ``multiprocessors``: enough for half of them, each slice four tiles at least (the partial sums' round trip
    is paid once a slice). On an H100 at 2 and 5 rows (``benchmarks/tune_gemv_rows.py --shape``, the projections of
    the Qwen2.5 0.5B / 1.5B speculative pair) the 0.5B's down projection, 896 x 4864 in 14 programs, took 9.9 us
    in one slice and 7.3 in 4; the 1.5B's, 1536 x 8960 in 24 programs, 16.7 us and 13.3 in 3 (14.8 in 6). The
    projections of 1,000 to 2,000 inputs got nothing from slices (a slice of one or two tiles), and 8B-sized
    projections (64 programs and more) fill the GPU without them."""
    programs = triton.cdiv(outputs, block_n)
    if not multiprocessors or programs * 4 > multiprocessors:
        return 1
    return max(1, min(inputs // (4 * block_k), triton.cdiv(multiprocessors, 2 * programs)))


def scale_blocks(weight: torch.Tensor, weight_scale: torch.Tensor | None) -> tuple[int, int]:
    """The ``(rows, inputs)`` of weight a scale covers when ``weight_scale`` holds one per block (block-wise FP8:
    ``[out / rows, in / inputs]``, rows contiguous); ``(0, 0)`` for none, or one per output row (``[out]`` or
    ``[out, 1]``)."""
    if weight_scale is None or weight_scale.dim() == 1 or weight_scale.shape == (weight.shape[0], 1):
        return 0, 0
    blocks = (weight.shape[0] // weight_scale.shape[0], weight.shape[1] // weight_scale.shape[1])
    assert (weight_scale.shape[0] * blocks[0], weight_scale.shape[1] * blocks[1]) == weight.shape, "whole blocks"
    assert weight_scale.shape[1] == 1 or weight_scale.stride(1) == 1, "block scales in contiguous rows"
    return blocks


def gemv_rows(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a few rows ``x`` (a matrix whose rows are contiguous runs); an 8-bit
    ``weight`` (FP8 or INT8) is multiplied by its float32 ``weight_scale`` (one per output row) before the bias
    is added; FP8 tiles beside bf16 inputs are multiplied in fp16 (module docstring). With one scale per block of
    weights (block-wise FP8, :func:`scale_blocks`) the tiles shrink to lie in one block."""
    assert x.dim() == 2 and weight.stride(1) == 1, "the GEMV takes a matrix of rows and reads weight rows as runs"
    assert (weight_scale is not None) == (weight.element_size() == 1), "8-bit weights come with a scale"
    x = x if x.stride(-1) == 1 else x.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    fp16_products = weight.dtype == torch.float8_e4m3fn and x.dtype == torch.bfloat16
    scale_block = scale_blocks(weight, weight_scale)
    config = gemv_rows_config(
        m, x.element_size(), shared_memory_per_block(x.device), weight.element_size(), fp16_products, k, n,
        num_sms(x.device), scale_block,
    )
    scale_stride = weight_scale.stride(0) if scale_block[0] else 0
    scale = weight if weight_scale is None else weight_scale if scale_block[0] else weight_scale.reshape(-1)
    bias_arg = bias if bias is not None else weight
    # Slices of whole K tiles; a split that leaves a slice empty would only store zeros.
    k_per_split = triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k
    split_k = triton.cdiv(k, k_per_split)
    partial = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device) if split_k > 1 else out
    _gemv_rows_kernel[(triton.cdiv(n, config.block_n), split_k)](
        x, weight, scale, bias_arg, partial, m, n, k, x.stride(0), weight.stride(0),
        scale_stride, HAS_SCALE=weight_scale is not None and not scale_block[0], SCALE_BLOCK_N=scale_block[0],
        SCALE_BLOCK_K=scale_block[1], HAS_BIAS=bias is not None,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        BLOCK_M=block_m(m), BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps,
        num_stages=config.num_stages,
        FP16_PRODUCTS=fp16_products, K_PER_SPLIT=k_per_split, SPLIT_K=split_k,
    )  # fmt: skip
    if split_k > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(m * n, block),)](
            partial, scale, bias_arg, out, m, n,
            HAS_SCALE=weight_scale is not None and not scale_block[0], HAS_BIAS=bias is not None,
            SPLIT_K=split_k, BLOCK=block,
        )  # fmt: skip
    return out
