"""4-bit weights through PyTorch's own INT4 kernel, "tinygemm" (``torch._weight_int4pack_mm``), on CUDA GPUs.

tinygemm multiplies up to a few bf16 rows by 4-bit weights held in the tensor cores' fragment order, so that
each lane loads 16 bytes of weights that are already where its MMA wants them, and dequantizes them in bf16
(``(q - 8) * scale + zero``, one rounding). On an H100 (``benchmarks/tune_int_gemv.py --tinygemm``, the
Llama-3.1-8B projections, groups of 128) a layer's four projections took 109 us at 4 rows against 235 for
brisk's few-row Triton GEMV and 93 against 97 at one row (groups of 32: 113 against 104); at 16 rows 267 against
236, still ahead of dequantizing for cuBLAS. Its rounding of each weight to bf16 is the one the cuBLAS path for
more rows always had; asymmetric weights also carry their zero point rounded to bf16, an error of up to 1/32 of
the group's scale shared by the group (the size of a weight's own rounding), where brisk's Triton kernels take it
exactly.

Layout (PyTorch's ``_convert_weight_to_int4pack``): ``[N / 8, K / (16 * inner), 32, inner / 2]`` int32, ``inner``
k-tiles of 16 inputs a 4-, 8- or 16-byte load. Word ``j`` of lane ``t`` in (n-tile, k-group) holds output
``8 * n_tile + t // 4``; its nibble ``p`` is input ``16 * (inner * k_group + 2 * j + p % 4 // 2) + 8 * (p % 2)
+ 2 * (t % 4) + p // 4`` (nibbles 0 to 3 hold even inputs, 4 to 7 the odd input after each). Scales and zero
points: ``[K / group, N, 2]`` bf16, where the zero point of unsigned integer zeros ``z`` is ``(8 - z) * scale``.
More than ``GEMV_MAX_ROWS`` rows (the bound of every few-row kernel, which decode graphs follow) dequantize the
weight from that layout (a Triton kernel) and multiply with cuBLAS.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from brisk.layers.fused import GEMV_MAX_ROWS

GROUPS = (32, 64, 128, 256)  # the group sizes tinygemm reads
# n-tiles (8 outputs each) a dequantizing program writes: 32 rows of 128 inputs for the 8B shapes, faster than the
# packed words' kernel on an H100 (``tune_int_gemv.py --tinygemm``); not swept.
DEQUANTIZE_N_TILES = 4


def inner_k_tiles(k: int) -> int:
    """The most k-tiles of 16 inputs a load (8, 4 or 2) that ``k`` inputs divide into."""
    return next(tiles for tiles in (8, 4, 2) if k % (16 * tiles) == 0)


def takes(n: int, k: int, bits: int, group: int, scales: torch.Tensor) -> bool:
    """Whether a ``[n, k]`` weight of ``bits``-bit values in groups of ``group``, with scales in the model's dtype,
    goes to tinygemm: 4 bits, its group sizes, bf16, a CUDA GPU with bf16 tensor cores, whole n-tiles and
    k-tile pairs, PyTorch 2.5 or newer on CUDA."""
    return (
        bits == 4
        and group in GROUPS
        and scales.dtype == torch.bfloat16
        and scales.is_cuda
        and n % 8 == 0
        and k % 32 == 0
        and k % group == 0
        and torch.__version__ >= "2.5"  # since when the layout converter takes two values a byte
        and torch.version.hip is None  # ROCm's converter writes another layout (64 lanes)
        and torch.cuda.get_device_capability(scales.device) >= (8, 0)
    )


def pack(
    codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tinygemm layout of unsigned 4-bit ``codes [N, K]``, and its scales and zero points from ``scales``
    and unsigned integer ``zeros`` ``[N, groups]`` (None: the midpoint 8)."""
    pairs = (codes[:, 0::2].to(torch.int32) << 4 | codes[:, 1::2].to(torch.int32)).to(torch.uint8)
    packed = torch._convert_weight_to_int4pack(pairs.contiguous(), inner_k_tiles(codes.shape[1]))
    zero = torch.zeros_like(scales) if zeros is None else ((8 - zeros.float()) * scales.float()).to(scales.dtype)
    return packed, torch.stack([scales, zero], dim=2).transpose(0, 1).contiguous()


@triton.jit
def _dequantize_kernel(packed_ptr, sz_ptr, out_ptr, N, K, K_GROUPS,
                       GROUP: tl.constexpr, INNER: tl.constexpr, N_TILES: tl.constexpr):  # fmt: skip
    """Program (``N_TILES`` n-tiles, one k-group): its ``[N_TILES, 32, INNER / 2]`` words, unpacked into
    ``[N_TILES * 8, 16 * INNER]`` rows of inputs in order, so that the stores are whole rows. With lane ``t = 4 *
    r + c`` and nibble ``p = 4 * h + 2 * a + b``, word ``j``'s value is output ``8 * tile + r`` at input ``32 * j +
    16 * a + 8 * b + 2 * c + h`` of the k-group (module docstring): ordering the axes (r, j, a, b, c, h) puts the
    inputs in order. A word's 32 inputs lie in one group (groups are 32 inputs or more), so each row reads one
    scale and zero point a group."""
    HALF: tl.constexpr = INNER // 2
    COLS: tl.constexpr = 16 * INNER
    SPAN: tl.constexpr = GROUP if GROUP < COLS else COLS  # inputs of the k-group under one scale
    tiles = tl.program_id(0) * N_TILES + tl.arange(0, N_TILES)
    k_group = tl.program_id(1)
    word_index = ((tiles[:, None, None] * K_GROUPS + k_group) * 32 + tl.arange(0, 32)[None, :, None]) * HALF
    word_index += tl.arange(0, HALF)[None, None, :]
    valid = (tiles < N // 8)[:, None, None]
    words = tl.load(packed_ptr + word_index.to(tl.int64), mask=valid, other=0)
    q = (words[:, :, :, None] >> (4 * tl.arange(0, 8))[None, None, None, :]) & 0xF  # [tiles, t, j, p]
    q = tl.reshape(q, (N_TILES, 8, 4, HALF, 2, 2, 2))  # t -> (r, c), p -> (h, a, b)
    q = tl.reshape(tl.permute(q, (0, 1, 3, 5, 6, 2, 4)), (N_TILES * 8, COLS // SPAN, SPAN))  # (r, j, a, b, c, h)
    rows = tl.program_id(0) * N_TILES * 8 + tl.arange(0, N_TILES * 8)
    row_mask = rows < N
    groups = (COLS * k_group + tl.arange(0, COLS // SPAN) * SPAN) // GROUP
    sz = sz_ptr + (groups[None, :] * N + rows[:, None]).to(tl.int64) * 2
    scale = tl.load(sz, mask=row_mask[:, None], other=0.0).to(tl.float32)
    zero = tl.load(sz + 1, mask=row_mask[:, None], other=0.0).to(tl.float32)
    # (q - 8) * scale is exact in float32 and the zero point's add too (both are multiples of the scale's last
    # bit, within 24 bits), so rounding once to bf16 gives tinygemm's own fused multiply-add.
    w = tl.reshape((q - 8).to(tl.float32) * scale[:, :, None] + zero[:, :, None], (N_TILES * 8, COLS))
    cols = COLS * k_group + tl.arange(0, COLS)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], w.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None])  # fmt: skip


def dequantize(packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """The bf16 weight ``[N, K]`` of a tinygemm-packed one."""
    n_tiles, k_groups, _, half = packed.shape
    n, k = scales_and_zeros.shape[1], k_groups * 32 * half
    out = torch.empty(n, k, dtype=scales_and_zeros.dtype, device=packed.device)
    _dequantize_kernel[(triton.cdiv(n_tiles, DEQUANTIZE_N_TILES), k_groups)](
        packed, scales_and_zeros, out, n, k, k_groups, GROUP=group, INNER=2 * half, N_TILES=DEQUANTIZE_N_TILES,
    )  # fmt: skip
    return out


def linear(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """``x [..., K] @ W^T`` for a tinygemm-packed ``W``: tinygemm up to ``GEMV_MAX_ROWS`` rows, cuBLAS on the
    dequantized weight above."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] == 0:  # tinygemm would launch an empty grid
        out = rows.new_empty(0, scales_and_zeros.shape[1])
    elif rows.shape[0] <= GEMV_MAX_ROWS:
        out = torch._weight_int4pack_mm(rows.contiguous(), packed, group, scales_and_zeros)
    else:
        out = F.linear(rows, dequantize(packed, scales_and_zeros, group))
    return out.reshape(*x.shape[:-1], -1)
