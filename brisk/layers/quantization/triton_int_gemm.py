"""Triton weight-only integer GEMM: ``x @ W^T`` with ``W = (q - zero) * scale`` from packed 2-, 4- or 8-bit
values, so batch-1 decode reads a quarter (int4) or half (int8) of a projection's bf16 bytes. (4-bit weights of
bf16 models in tinygemm's groups go to PyTorch's tinygemm instead, ``tinygemm.py``: faster from 1 to 16 rows.)

Layout (compressed-tensors' ``pack-quantized``, kept as loaded): ``packed [N, K * bits / 32]`` int32, value ``k``
of a row at bits ``(k % per_word) * bits`` of word ``k // per_word``, unsigned (offset ``2 ** (bits - 1)``
for symmetric weights); ``scales [N, K / group]``; ``zeros [N, K / group]`` (unsigned, or None: the offset).
A GEMV serves one row (batch-1 decode); 2 to ``GEMV_MAX_ROWS`` rows take a tensor-core GEMV that dequantizes
each weight tile in registers (the few-row GEMV's layout, ``layers/triton_gemv_rows.py``); more rows dequantize
the weight into the activation dtype and multiply with cuBLAS.

The GEMV spends an and, a subtraction and a fused multiply-add on each value (about five instructions with the
loads, conversions and scales, in its sm_90 code), in 2-D ``[rows, words]`` tiles with one cross-lane reduction
per output block. Its predecessor unpacked ``[rows, words, values]`` tiles and reduced them twice every K step,
with layout conversions and a scale gathered per value: 0.3 to 0.6 TB/s on an H200. This one reached 0.9 to 1.7
TB/s there (INT4, groups of 128: 81 to 84 us for the four Llama-3.1-8B projections of a layer, against 142 us for
the bf16 GEMV and 224 us before); the same loads with one add a word took 55 us, so it is still bound by its
instructions and their latency rather than by memory. The sums are float32 sums of the exact products
``(q - zero) * x``, rounded once to the output dtype.

Tested under ``TRITON_INTERPRET=1`` on the CPU and on an H200 (``tests/gpu``) against the dequantized
reference (the few-row GEMV on the CPU only so far)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


class GemvConfig(NamedTuple):
    block_n: int  # outputs a program computes
    words: int  # packed words of each of its rows per K step
    num_warps: int


def gemv_config(n: int) -> GemvConfig:
    """The GEMV's tile for ``n`` outputs. On an H200 (benchmarks/tune_int_gemv.py: INT4, groups of 128, the
    Llama-3.1-8B projections, best of three medians), 4 x 512 words over 4 warps (4 rows of 4 words a lane) took
    84 us for the four projections; 4 x 256 or 2 x 256 words over 2 warps were within 2%, tiles of 8 rows 12 to
    45% slower, and programs that walk several row blocks loading the next tile ahead (into registers, or
    through Triton's cp.async pipelining) 4 to 50% slower. The MLP's 28672 outputs went 7 to 16% faster with one
    warp per 4 x 128 words, which made the other shapes 8 to 37% slower."""
    return GemvConfig(4, 128, 1) if n >= 16384 else GemvConfig(4, 512, 4)


# The GEMV's tile for every shape when set (benchmarks/tune_int_gemv.py sweeps it), else gemv_config's; and the
# dequantizing kernel's (BLOCK_N, WORDS) tile (a lead, not yet measured).
GEMV_CONFIG: GemvConfig | None = None
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
def _pairs(x):
    """The even and the odd elements along the last axis of ``x [WORDS, 2 * n]``, each ``[WORDS, n]``."""
    return tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))


@triton.jit
def _columns4(x):
    """Columns ``0..3`` of ``x [WORDS, 4]``, each ``[WORDS]``."""
    even, odd = _pairs(x)
    e0, e1 = tl.split(even)
    o0, o1 = tl.split(odd)
    return e0, o0, e1, o1


@triton.jit
def _columns8(x):
    even, odd = _pairs(x)
    e0, e1, e2, e3 = _columns4(even)
    o0, o1, o2, o3 = _columns4(odd)
    return e0, o0, e1, o1, e2, o2, e3, o3


@triton.jit
def _columns16(x):
    even, odd = _pairs(x)
    e0, e1, e2, e3, e4, e5, e6, e7 = _columns8(even)
    o0, o1, o2, o3, o4, o5, o6, o7 = _columns8(odd)
    return e0, o0, e1, o1, e2, o2, e3, o3, e4, o4, e5, o5, e6, o6, e7, o7


@triton.jit(do_not_specialize=["stride_pn"])
def _int_weight_gemv_kernel(
    x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, N, K_WORDS, stride_pn, stride_sn, stride_zn,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_N: tl.constexpr, WORDS: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One row: each program owns ``BLOCK_N`` outputs and walks their packed words in ``[BLOCK_N, WORDS]``
    tiles. Everything stays in that 2-D shape, one float32 sum per word, until the one cross-lane reduction at
    the end; per element the loop costs an and, a subtraction and a fused multiply-add.

    Layout: lane ``l`` of the program holds words ``l, l + 32 * num_warps, ...`` of each of its rows. That is the
    layout in which the inputs arrive: the ``[WORDS, per_word]`` tile of inputs, contiguous, is loaded as one
    vector a word (16 bytes for 4 bits, 8 for 8 bits; 2-bit words' 32 bytes take two lanes and a pass through
    shared memory) and split into its ``per_word`` columns in registers. (With the row stride
    unspecialized, Triton loads the words 4 bytes a lane, still 128 contiguous bytes a warp, rather than 16 bytes
    a lane, which would need the inputs moved through shared memory to meet them; that measured slower.)

    Values: each half-word is put under the exponent of ``2**23``; value ``j`` of a word, masked out in place,
    is then ``q * 2**s`` (``s`` its offset in the half) in the mantissa, and one subtraction gives it exactly as
    a float (no quarter-rate int-to-float conversion, no shift per value). Its input is scaled by ``2**-s``, also
    exact, once per column for all ``BLOCK_N`` rows. Symmetric weights take the midpoint off in the same
    subtraction; zero points come off once per word, as ``zero * sum_j x_j``. Each word's sum is multiplied by
    its group's scale (a group spans ``GROUP / per_word`` words) into the accumulator. Rows past N repeat row
    N - 1 and words past K read as zeros, with zero inputs, so that only the store is masked."""
    PER_WORD: tl.constexpr = 32 // BITS
    PER_HALF: tl.constexpr = 16 // BITS
    GROUP_WORDS: tl.constexpr = GROUP // PER_WORD
    tl.static_assert(GROUP % PER_WORD == 0, "a group spans whole words")
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)[:, None]
    word_rows = packed_ptr + rows.to(tl.int64) * stride_pn
    acc = tl.zeros([BLOCK_N, WORDS], tl.float32)
    for w0 in range(0, K_WORDS, WORDS):
        offs_w = w0 + tl.arange(0, WORDS)
        x_ptrs = x_ptr + offs_w[:, None] * PER_WORD + tl.arange(0, PER_WORD)[None, :]
        if EVEN_K:
            words = tl.load(word_rows + offs_w[None, :])
            x = tl.load(x_ptrs).to(tl.float32)
            group = offs_w // GROUP_WORDS
        else:
            words = tl.load(word_rows + offs_w[None, :], mask=(offs_w < K_WORDS)[None, :], other=0)
            x = tl.load(x_ptrs, mask=(offs_w < K_WORDS)[:, None], other=0.0).to(tl.float32)
            group = tl.minimum(offs_w, K_WORDS - 1) // GROUP_WORDS
        if PER_WORD == 4:
            columns = _columns4(x)
        elif PER_WORD == 8:
            columns = _columns8(x)
        else:
            columns = _columns16(x)
        low = (words & 0xFFFF) | 0x4B000000
        high = (words.to(tl.uint32, bitcast=True) >> 16).to(tl.int32, bitcast=True) | 0x4B000000
        partial = tl.zeros([BLOCK_N, WORDS], tl.float32)
        x_sum = tl.zeros([WORDS], tl.float32)
        for j in tl.static_range(PER_WORD):
            shift = j % PER_HALF * BITS
            if j < PER_HALF:
                half = low
            else:
                half = high
            magic = (half & (0x4B000000 | ((1 << BITS) - 1) << shift)).to(tl.float32, bitcast=True)  # 2**23 + q*2**s
            if HAS_ZEROS:
                x_sum += columns[j]
                q = magic - 8388608.0
            else:
                q = magic - (8388608.0 + (1 << (BITS - 1 + shift)))
            partial = tl.fma(q, (columns[j] * (1.0 / (1 << shift)))[None, :], partial)
        if HAS_ZEROS:
            zero = tl.load(zeros_ptr + rows * stride_zn + group[None, :])
            partial -= ((zero | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * x_sum[None, :]
        scale = tl.load(scales_ptr + rows * stride_sn + group[None, :]).to(tl.float32)
        acc = tl.fma(partial, scale, acc)
    tl.store(out_ptr + offs_n, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _int_weight_gemv_rows_kernel(
    x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K, x_stride, stride_pn, stride_sn, stride_zn,
    BITS: tl.constexpr, GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """A few rows: each program owns ``BLOCK_N`` outputs of every row, as the few-row GEMV does, and walks K in
    tiles of ``BLOCK_K`` values. Each tile's packed words are unpacked, their zero points taken off and their
    scales applied in float32 (one scale and zero a group, broadcast over its values: ``BLOCK_K`` and ``GROUP``
    divide one another), rounded once to the input dtype (``dequantize_packed`` rounds to the scales' dtype, the
    same when they match), and multiplied on the tensor cores with the weight tile as the wide operand. The
    weight's bytes are read once for all rows."""
    PER_WORD: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // PER_WORD
    TILE_GROUP: tl.constexpr = GROUP if GROUP < BLOCK_K else BLOCK_K  # values of a tile under one scale
    TILE_GROUPS: tl.constexpr = BLOCK_K // TILE_GROUP
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < M
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    shifts = tl.arange(0, PER_WORD) * BITS
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_w = k0 // PER_WORD + tl.arange(0, WORDS)
        w_mask = n_mask[:, None] & (offs_w < K // PER_WORD)[None, :]
        words = tl.load(packed_ptr + n[:, None].to(tl.int64) * stride_pn + offs_w[None, :], mask=w_mask, other=0)
        q = (words[:, :, None] >> shifts[None, None, :]) & ((1 << BITS) - 1)  # [BLOCK_N, WORDS, PER_WORD]
        q = tl.reshape(q, (BLOCK_N, TILE_GROUPS, TILE_GROUP)).to(tl.float32)
        groups = (k0 + tl.arange(0, TILE_GROUPS) * TILE_GROUP) // GROUP
        g_mask = n_mask[:, None] & (groups * GROUP < K)[None, :]
        scale = tl.load(scales_ptr + n[:, None] * stride_sn + groups[None, :], mask=g_mask, other=0.0)
        if HAS_ZEROS:
            zero = tl.load(zeros_ptr + n[:, None] * stride_zn + groups[None, :], mask=g_mask, other=0)
            q = q - zero.to(tl.float32)[:, :, None]
        else:
            q = q - (1 << (BITS - 1))
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=row_mask[:, None] & (cols < K)[None, :],
                    other=0.0)  # fmt: skip
        w = tl.reshape(q * scale.to(tl.float32)[:, :, None], (BLOCK_N, BLOCK_K)).to(x.dtype)
        acc = tl.dot(w, tl.trans(x), acc, input_precision="ieee" if x.dtype == tl.float32 else "tf32")
    tl.store(out_ptr + rows[None, :] * N + n[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=row_mask[None, :] & n_mask[:, None])  # fmt: skip


class RowsTile(NamedTuple):
    """The few-row INT GEMV's tile: outputs a program computes, values a K step, warps, pipeline stages."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def gemv_rows_tile(n: int) -> RowsTile:
    """Measured on the H200 at 4 and 16 rows over the 8B projections (``tune_int_gemv.py --rows``, twentieth
    run; INT4, groups of 128): the wide gate/up projection (28,672 outputs) is fastest with 64 outputs and
    256-value steps (89.9 us against 110.6 with 32 x 128), the others with 32 outputs and 128-value steps in 4
    stages (o 27.6 against 34.8 us, down 83.3 against 107.5, qkv within 10% either way), which keeps more
    programs on the SMs."""
    return RowsTile(64, 256, 4, 3) if n >= 16384 else RowsTile(32, 128, 4, 4)


# The few-row tile for every shape when set (benchmarks/tune_int_gemv.py sweeps it), else gemv_rows_tile's.
GEMV_ROWS_TILE: RowsTile | None = None


def _gemv_rows_takes(rows: int, n: int, group_size: int, device: torch.device) -> RowsTile | None:
    """The tile of the few-row INT GEMV when ``rows`` rows take it: 2 to ``GEMV_MAX_ROWS`` of them, on the
    interpreter or a GPU with bf16 tensor cores, with groups that tile its K steps (a divisor or a multiple of
    them); else None."""
    from brisk.layers.fused import GEMV_MAX_ROWS, has_bf16_tensor_cores

    tile = GEMV_ROWS_TILE or gemv_rows_tile(n)
    if not 2 <= rows <= GEMV_MAX_ROWS or (tile.block_k % group_size and group_size % tile.block_k):
        return None
    return tile if device.type != "cuda" or has_bf16_tensor_cores(device) else None


def _int_weight_gemv_rows(
    rows: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    group: int,
    tile: RowsTile,
) -> torch.Tensor:
    m, k = rows.shape
    n = packed.shape[0]
    out = torch.empty(m, n, dtype=rows.dtype, device=rows.device)
    zeros_arg = zeros if zeros is not None else scales
    block_n, block_k, warps, stages = tile
    _int_weight_gemv_rows_kernel[(triton.cdiv(n, block_n),)](
        rows, packed, scales, zeros_arg, out, m, n, k, rows.stride(0), packed.stride(0), scales.stride(0),
        zeros_arg.stride(0), BITS=bits, GROUP=group, HAS_ZEROS=zeros is not None,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    return out


def int_weight_gemm(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    group_size: int,
) -> torch.Tensor:
    """``x [..., K] @ W^T`` for the packed ``W [N, K]`` described in the module docstring."""
    for t in (packed, scales, zeros):  # a single column's stride does not matter
        assert t is None or t.shape[-1] == 1 or t.stride(-1) == 1, "the kernels read rows as runs"
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    M, K = rows.shape
    N = packed.shape[0]
    if M == 1:  # batch-1 decode: weight-bound, no tensor-core tile to fill
        out = torch.empty(M, N, dtype=x.dtype, device=x.device)
        zeros_arg = zeros if zeros is not None else scales
        config = GEMV_CONFIG or gemv_config(N)
        _int_weight_gemv_kernel[(triton.cdiv(N, config.block_n),)](
            rows, packed, scales, zeros_arg, out, N, packed.shape[1], packed.stride(0), scales.stride(0),
            zeros_arg.stride(0), BITS=bits, GROUP=group_size, HAS_ZEROS=zeros is not None, BLOCK_N=config.block_n,
            WORDS=config.words, EVEN_K=packed.shape[1] % config.words == 0, num_warps=config.num_warps,
        )  # fmt: skip
        return out.reshape(*x.shape[:-1], N)
    tile = _gemv_rows_takes(M, N, group_size, x.device)
    if tile is not None:
        return _int_weight_gemv_rows(rows, packed, scales, zeros, bits, group_size, tile).reshape(*x.shape[:-1], N)
    # More rows: dequantize once into the activation dtype and let cuBLAS multiply (the weight's extra bytes are
    # read once for all rows; a kernel dequantizing inside the tensor-core loop redoes it per row tile).
    return F.linear(rows, dequantize_packed(packed, scales, zeros, bits, group_size).to(x.dtype)).reshape(
        *x.shape[:-1], N
    )
