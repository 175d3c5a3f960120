"""Triton GEMV for batch-1 decode, with the op that precedes a projection fused into its input.

At batch 1 a decode step of an 8B model is ~130 weight reads of 30 to 230 MB each, so its time is the weight
bytes over the bandwidth each kernel reaches, plus a gap at every kernel boundary. This kernel streams the
weights in wide tiles, and can compute its input on the fly from the (residual add +) RMSNorm or the
SiLU-and-mul that comes before the projection, which removes those launches and their round trips through
memory. (Several rows would need a tensor-core tile to keep the loads wide; batches above one go to cuBLAS.)
A gated MLP's gate/up GEMV can instead end with the SiLU-and-mul (``fuses_silu_and_mul`` says when), so that the
down projection, whose long input takes the tiled kernel, does not compute the activation again in every program.

With programmatic dependent launch (``pdl.py``) a GEMV loads its first weight tile, which does not depend on
the previous kernel, before it waits for that kernel's results.

Rounding follows the unfused ops (``triton_ops.py``): the residual sum, the normalized value and the SiLU are
rounded to the activation dtype where the separate kernels would store them; products accumulate in fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from brisk.layers.device_limits import num_sms
from brisk.layers.pdl import allow_next_kernel, pdl_launch_options, wait_for_previous_kernel

PROLOGUE_NONE: tl.constexpr = tl.constexpr(0)
PROLOGUE_RMS_NORM: tl.constexpr = tl.constexpr(1)
PROLOGUE_SILU_AND_MUL: tl.constexpr = tl.constexpr(2)


@triton.jit
def _rms_normalize(x, rstd, norm_w):
    normed = (x.to(tl.float32) * rstd).to(x.dtype)
    return (normed.to(tl.float32) * norm_w.to(tl.float32)).to(x.dtype)


@triton.jit
def _silu_and_mul(gate, up):
    """``silu(gate) * up`` in the dtype of both, rounded where ``triton_ops.silu_and_mul`` rounds."""
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)


@triton.jit
def _input_tile(x_ptr, residual_ptr, norm_ptr, cols, col_mask, K, rstd,
                PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    """The GEMV input at ``cols`` after the prologue, as the activation dtype."""
    x = tl.load(x_ptr + cols, mask=col_mask, other=0.0)
    if PROLOGUE == PROLOGUE_SILU_AND_MUL:  # x holds [gate | up]; cols index the gate half
        x = _silu_and_mul(x, tl.load(x_ptr + K + cols, mask=col_mask, other=0.0))
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + cols, mask=col_mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    if PROLOGUE == PROLOGUE_RMS_NORM:
        x = _rms_normalize(x, rstd, tl.load(norm_ptr + cols, mask=col_mask, other=0.0))
    return x


@triton.jit
def _store_residual(residual_out_ptr, x, pid, cols, col_mask):
    """Program 0 stores ``x + residual`` for the next layer; the others only read it."""
    first_program = (cols * 0 + pid) == 0  # as a tensor: the interpreter masks with tensors only
    tl.store(residual_out_ptr + cols, x, mask=col_mask & first_program)


@triton.jit
def _weight_tile(weight_ptr, block, offs_n, cols, col_mask, N, weight_stride, BLOCK_N: tl.constexpr):
    n = block * BLOCK_N + offs_n
    ptrs = weight_ptr + n[:, None].to(tl.int64) * weight_stride + cols[None, :]
    return tl.load(ptrs, mask=(n < N)[:, None] & col_mask[None, :], other=0.0)


@triton.jit
def _dot(w, x):
    """``w[BLOCK_N, BLOCK_K] @ x[BLOCK_K]`` in fp32."""
    return tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)


@triton.jit
def _finish_rows(bias_ptr, scale_ptr, acc, rows, row_mask, dtype, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr):
    """The products ``acc`` of weight ``rows``, scaled, biased and rounded to ``dtype`` as they are stored."""
    if HAS_SCALE:  # FP8 weights: one float32 scale per output row
        acc *= tl.load(scale_ptr + rows, mask=row_mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    return acc.to(dtype)


@triton.jit
def _store_output(out_ptr, bias_ptr, scale_ptr, acc, block, offs_n, N, BLOCK_N: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr):  # fmt: skip
    n = block * BLOCK_N + offs_n
    n_mask = n < N
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + n, _finish_rows(bias_ptr, scale_ptr, acc, n, n_mask, dtype, HAS_BIAS, HAS_SCALE), mask=n_mask)


@triton.jit
def _store_gated_output(out_ptr, bias_ptr, scale_ptr, gate_acc, up_acc, block, offs_n, N, BLOCK_N: tl.constexpr,
                        HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr):  # fmt: skip
    """``silu(gate) * up`` of weight rows ``n`` (gate) and ``N + n`` (up), each first rounded as if stored."""
    n = block * BLOCK_N + offs_n
    n_mask = n < N
    dtype = out_ptr.dtype.element_ty
    gate = _finish_rows(bias_ptr, scale_ptr, gate_acc, n, n_mask, dtype, HAS_BIAS, HAS_SCALE)
    up = _finish_rows(bias_ptr, scale_ptr, up_acc, N + n, n_mask, dtype, HAS_BIAS, HAS_SCALE)
    tl.store(out_ptr + n, _silu_and_mul(gate, up), mask=n_mask)


@triton.jit
def _gemv_resident_kernel(
    x_ptr, weight_ptr, bias_ptr, scale_ptr, out_ptr, residual_ptr, norm_ptr, residual_out_ptr, N, K, weight_stride,
    eps, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr, GATED: tl.constexpr,
):  # fmt: skip
    """K fits one tile (``K <= BLOCK_K``): each program prepares the input once, then walks the output blocks
    ``pid, pid + programs, ...``, loading the next weight tile before it reduces the current one. ``GATED``: the
    weight holds ``2 N`` rows, gate then up, and output ``n`` is ``silu(gate_n) * up_n`` (the gated MLP's
    activation), so a block loads its gate rows and the up rows ``N`` further on."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs_n = tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    col_mask = cols < K
    up_ptr = weight_ptr + tl.cast(N, tl.int64) * weight_stride  # N == 1 arrives as a constant, not a tensor
    allow_next_kernel(USE_PDL)
    w = _weight_tile(weight_ptr, pid, offs_n, cols, col_mask, N, weight_stride, BLOCK_N)
    if GATED:
        u = _weight_tile(up_ptr, pid, offs_n, cols, col_mask, N, weight_stride, BLOCK_N)
    if PROLOGUE == PROLOGUE_RMS_NORM:  # a weight too: loaded before the wait, not after the residual store
        norm_w = tl.load(norm_ptr + cols, mask=col_mask, other=0.0)
    wait_for_previous_kernel(USE_PDL)

    if PROLOGUE == PROLOGUE_RMS_NORM:
        x = _input_tile(x_ptr, residual_ptr, norm_ptr, cols, col_mask, K, 0.0, PROLOGUE_NONE, HAS_RESIDUAL)
        if HAS_RESIDUAL:
            _store_residual(residual_out_ptr, x, pid, cols, col_mask)
        xf = x.to(tl.float32)
        x = _rms_normalize(x, tl.rsqrt(tl.sum(xf * xf, axis=0) / K + eps), norm_w)
    else:
        x = _input_tile(x_ptr, residual_ptr, norm_ptr, cols, col_mask, K, 0.0, PROLOGUE, HAS_RESIDUAL)

    for block in range(pid, tl.cdiv(N, BLOCK_N), programs):
        next_w = _weight_tile(weight_ptr, block + programs, offs_n, cols, col_mask, N, weight_stride, BLOCK_N)
        if GATED:
            next_u = _weight_tile(up_ptr, block + programs, offs_n, cols, col_mask, N, weight_stride, BLOCK_N)
            _store_gated_output(out_ptr, bias_ptr, scale_ptr, _dot(w, x), _dot(u, x), block, offs_n, N, BLOCK_N,
                                HAS_BIAS, HAS_SCALE)  # fmt: skip
            u = next_u
        else:
            _store_output(out_ptr, bias_ptr, scale_ptr, _dot(w, x), block, offs_n, N, BLOCK_N, HAS_BIAS, HAS_SCALE)
        w = next_w


@triton.jit
def _gemv_tiled_kernel(
    x_ptr, weight_ptr, bias_ptr, scale_ptr, out_ptr, residual_ptr, norm_ptr, residual_out_ptr, N, K, weight_stride,
    eps, PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Any K: one program per ``BLOCK_N`` outputs walks K in ``BLOCK_K`` tiles and applies the prologue to each
    input tile (the RMSNorm first takes a pass over the input for its norm)."""
    pid = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    allow_next_kernel(USE_PDL)
    w = _weight_tile(weight_ptr, pid, offs_n, offs_k, offs_k < K, N, weight_stride, BLOCK_N)
    wait_for_previous_kernel(USE_PDL)

    rstd = 0.0
    if PROLOGUE == PROLOGUE_RMS_NORM:
        sum_sq = 0.0
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + offs_k
            x = _input_tile(x_ptr, residual_ptr, norm_ptr, cols, cols < K, K, 0.0, PROLOGUE_NONE, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                _store_residual(residual_out_ptr, x, pid, cols, cols < K)
            xf = x.to(tl.float32)
            sum_sq += tl.sum(xf * xf, axis=0)
        rstd = tl.rsqrt(sum_sq / K + eps)

    acc = _dot(w, _input_tile(x_ptr, residual_ptr, norm_ptr, offs_k, offs_k < K, K, rstd, PROLOGUE, HAS_RESIDUAL))
    for k0 in range(BLOCK_K, K, BLOCK_K):
        cols = k0 + offs_k
        w = _weight_tile(weight_ptr + k0, pid, offs_n, offs_k, cols < K, N, weight_stride, BLOCK_N)
        acc += _dot(w, _input_tile(x_ptr, residual_ptr, norm_ptr, cols, cols < K, K, rstd, PROLOGUE, HAS_RESIDUAL))
    _store_output(out_ptr, bias_ptr, scale_ptr, acc, pid, offs_n, N, BLOCK_N, HAS_BIAS, HAS_SCALE)


class GemvConfig(NamedTuple):
    block_n: int
    block_k: int
    num_warps: int
    programs_per_sm: int  # for the resident kernel; 0 takes the tiled kernel


def gemv_config(n: int, k: int, weight_bytes: int = 2, prologue: bool = True) -> GemvConfig:
    """Measured on an H200 (``benchmarks/tune_gemv.py``, Llama-3.1-8B projections): an input of up to 4096
    elements stays in registers while four programs per SM stream 2-row weight tiles; the LM head's many blocks
    take one program per 4 x 4096 tile, and longer inputs (the down projection) one per 8 x 1024 tiles. Every
    choice keeps several 16-byte loads per thread in flight. 8-bit weights (``weight_bytes`` 1) take the same
    tiles, except 8 x 2048 (bf16's bytes) for longer inputs with no ``prologue`` to compute: for the down
    projection after a gate/up GEMV that ended with the activation, that took the 8B shape's 32-layer stack of FP8
    projections from 2.73 to 2.60 ms on an H100. With a prologue (the tiled kernel computes it again for every
    tile), tiles of bf16's bytes had made batch-1 decode slower on the H200 (296 against 333 tokens/s)."""
    if k <= 4096:
        return GemvConfig(2, triton.next_power_of_2(k), 8, 4) if n < 65536 else GemvConfig(4, 4096, 4, 0)
    return GemvConfig(8, 2048 if weight_bytes == 1 and not prologue else 1024, 8, 0)


def fuses_silu_and_mul(rows: int, k: int, weight_bytes: int) -> bool:
    """Whether the GEMV ends a ``[rows, k]`` gate/up projection with SiLU-and-mul (``rms_norm_gemv(...,
    silu_and_mul=True)``): for 8-bit weights whose input stays resident (hidden sizes up to 4096). On an H100 the
    8B shape's 32-layer stack of FP8 projections took 2.73 against 2.83 ms that way (the down GEMV's tiled kernel
    no longer recomputing the activation in every program; 2.60 with its tiles of bf16's bytes), and W3 309.5
    against 301.8 tokens/s; in bf16 it lost (4.78 against 4.63 ms, W3 190.8 against 196.6)."""
    return weight_bytes == 1 and gemv_config(rows, k, weight_bytes).programs_per_sm > 0


def _launch(x, weight, bias, out, k, residual=None, norm_weight=None, residual_out=None, eps=0.0,
            prologue=PROLOGUE_NONE, weight_scale=None, gated=False):  # fmt: skip
    n = out.shape[-1]
    assert weight.stride(1) == 1, "the GEMV reads weight rows as contiguous runs"
    config = gemv_config(weight.shape[0], k, weight.element_size(), prologue.value != PROLOGUE_NONE.value)
    if gated:  # a block's gate rows and up rows together: the tile of the ungated launch, in two halves
        assert config.programs_per_sm, "only the resident kernel ends with SiLU-and-mul"
        config = config._replace(block_n=max(1, config.block_n // 2))
    blocks = triton.cdiv(n, config.block_n)
    if config.programs_per_sm:
        kernel, grid = _gemv_resident_kernel, min(blocks, config.programs_per_sm * num_sms(x.device))
        options = {"GATED": gated, **pdl_launch_options(x.device, 1)}
    else:
        kernel, grid, options = _gemv_tiled_kernel, blocks, pdl_launch_options(x.device, 1)
    kernel[(grid,)](
        x, weight, bias if bias is not None else weight, weight_scale if weight_scale is not None else weight, out,
        residual if residual is not None else x, norm_weight if norm_weight is not None else weight,
        residual_out if residual_out is not None else out, n, k, weight.stride(0), eps,
        PROLOGUE=prologue.value, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
        HAS_SCALE=weight_scale is not None,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, num_warps=config.num_warps, **options,
    )  # fmt: skip


def _row(x: torch.Tensor) -> torch.Tensor:
    assert x.shape[0] == 1 and x.dim() == 2, "the GEMV takes one row"
    return x if x.stride(-1) == 1 else x.contiguous()


def _output(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.empty((1, weight.shape[0]), dtype=x.dtype, device=x.device)


def gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for one row ``x``; with ``weight_scale`` (float32, one per output row) the
    weight is FP8 and each output is scaled before the bias: weight-only FP8, half the bytes of bf16."""
    x = _row(x)
    out = _output(x, weight)
    _launch(x, weight, bias, out, x.shape[1], weight_scale=weight_scale)
    return out


def rms_norm_gemv(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    weight_scale: torch.Tensor | None = None,
    silu_and_mul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(F.linear(rms_norm(x + residual), weight, bias), x + residual)``; without ``residual``, x stands alone.
    ``weight_scale``: as in :func:`gemv`. ``silu_and_mul`` (where :func:`fuses_silu_and_mul`): the weight is a
    gated MLP's ``[gate | up]`` and the first value is ``silu(gate) * up``, so that the down projection needs no
    prologue; its tiled kernel would recompute the activation in every program."""
    x = _row(x)
    assert not silu_and_mul or weight.shape[0] % 2 == 0, "a [gate | up] weight has an even number of rows"
    out = torch.empty((1, weight.shape[0] // 2), dtype=x.dtype, device=x.device) if silu_and_mul else _output(x, weight)
    residual_out = torch.empty_like(x) if residual is not None else x
    residual = _row(residual) if residual is not None else None
    _launch(x, weight, bias, out, x.shape[1], residual, norm_weight, residual_out, eps, PROLOGUE_RMS_NORM,
            weight_scale, silu_and_mul)  # fmt: skip
    return out, residual_out


def silu_and_mul_gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(silu(gate) * up, weight, bias)`` where ``x = [gate | up]``; ``weight_scale``: as in :func:`gemv`."""
    x = _row(x)
    out = _output(x, weight)
    _launch(x, weight, bias, out, x.shape[1] // 2, prologue=PROLOGUE_SILU_AND_MUL, weight_scale=weight_scale)
    return out
