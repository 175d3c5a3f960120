"""Triton kernels for attention over brisk's paged KV cache, and their Python launchers.

Cache layout (see ``backend.py``): ``kv_cache[2, num_blocks, block_size, num_kv_heads, head_size]``; token
``t`` of a sequence lives in page ``block_table[t // block_size]`` at offset ``t % block_size``.

Three launchers:

* ``write_kv_cache``: scatter this step's keys/values into their slots (slot ``-1`` = skip);
  ``rope_and_write_kv_cache`` applies the rotary embedding to queries and keys in the same launch.
* ``unified_attention``: any mix of prefill chunks (with cached prefix), extends and decodes in one launch.
  The grid is ``(query blocks of all sequences, kv heads)``; a program owns ``BLOCK_Q`` consecutive query
  tokens of one sequence times the ``num_heads // num_kv_heads`` query heads that share one kv head
  (``BLOCK_M`` rows in all), so each KV tile is loaded once for the whole GQA group and repeated KV is never
  materialized. It walks the sequence's pages with an online softmax (fp32 statistics and accumulator,
  ``exp2`` with the scale folded in); KV tiles wholly below the block's first query skip the causal mask.
* ``decode_attention``: decode-only batches (one query token per sequence), flash-decoding style, in one launch
  per layer: it also applies the rotary embedding and stores the step's keys and values. The grid is
  ``(seqs, kv heads, splits)``; each sequence's context is cut *in the kernel* into ``num_splits`` equal
  partitions (rounded to the KV tile, at least ``min_partition`` tokens), so the grid depends only on the
  batch size and the host-side ``max_seq_len`` bound, never on device data (CUDA-graph friendly: no sync, no
  data-dependent allocation). Each program packs the GQA group's query heads into one tile. A sequence that
  uses one partition gets its output written directly; otherwise each program writes a partial output and its
  log-sum-exp, and the last one to finish merges them (no second launch).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from brisk.layers.attention.backend import AttentionMetadata
from brisk.layers.device_limits import num_sms, shared_memory_per_block
from brisk.layers.pdl import allow_next_kernel, pdl_launch_options, prefetch_line_to_l2, wait_for_previous_kernel
from brisk.layers.quantization.triton_fp8 import round_to_e4m3
from brisk.layers.triton_ops import rotary_factors, rotate_heads

LOG2E = 1.4426950408889634


# ------------------------------------------------------------------------------------------------------------
# KV cache writer
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def _to_cache(x, scale, cache_dtype: tl.constexpr, FP8_KV: tl.constexpr):
    """``x`` as a cache entry: for an FP8 cache divided by the layer's scale, saturated at +-448 and rounded to
    nearest even (the readers fold the scale back into the attention scores and the output)."""
    if FP8_KV:
        return round_to_e4m3(tl.clamp(x.to(tl.float32) / scale, -448.0, 448.0)).to(cache_dtype)
    return x.to(cache_dtype)


@triton.jit
def _write_kv_cache_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_ct,
    stride_ch,
    k_scale,
    v_scale,
    BLOCK_SIZE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_P2: tl.constexpr,
    BLOCK_H: tl.constexpr,
    FP8_KV: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    page = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_P2)
    mask = (heads < num_kv_heads)[:, None] & (offs_d < HEAD_SIZE)[None, :]
    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + offs_d[None, :], mask=mask)
    dst = page * stride_cb + offset * stride_ct + heads[:, None] * stride_ch + offs_d[None, :]
    cache_dtype = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + dst, _to_cache(k, k_scale, cache_dtype, FP8_KV), mask=mask)
    tl.store(v_cache_ptr + dst, _to_cache(v, v_scale, cache_dtype, FP8_KV), mask=mask)


@triton.jit
def _rope_and_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr, slot_mapping_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_ct, stride_ch, trig_stride,
    k_scale, v_scale,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, Q_HEADS_P2: tl.constexpr, KV_HEADS_P2: tl.constexpr,
    HALF: tl.constexpr, HALF_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr, FP8_KV: tl.constexpr,
):  # fmt: skip
    """One program per token: rotate its query and key heads in place and store its keys and values in the cache."""
    token = tl.program_id(0).to(tl.int64)
    cos, sin, offs, dmask = rotary_factors(cos_ptr, sin_ptr, pos_ptr, token, trig_stride, HALF, HALF_P2)
    rotate_heads(q_ptr, stride_qt, stride_qh, token, cos, sin, offs, dmask, NUM_Q_HEADS, Q_HEADS_P2, HALF)
    k1, k2, mask = rotate_heads(k_ptr, stride_kt, stride_kh, token, cos, sin, offs, dmask, NUM_KV_HEADS,
                                 KV_HEADS_P2, HALF)  # fmt: skip
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:  # -1: a padding token, nothing to store
        heads = tl.arange(0, KV_HEADS_P2)
        v_ptrs = v_ptr + token * stride_vt + heads[:, None] * stride_vh + offs[None, :]
        v1 = tl.load(v_ptrs, mask=mask, other=0.0)
        v2 = tl.load(v_ptrs + HALF, mask=mask, other=0.0)
        dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + heads[:, None] * stride_ch
        dst += offs[None, :]
        cache_dtype = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + dst, _to_cache(k1, k_scale, cache_dtype, FP8_KV), mask=mask)
        tl.store(k_cache_ptr + dst + HALF, _to_cache(k2, k_scale, cache_dtype, FP8_KV), mask=mask)
        tl.store(v_cache_ptr + dst, _to_cache(v1, v_scale, cache_dtype, FP8_KV), mask=mask)
        tl.store(v_cache_ptr + dst + HALF, _to_cache(v2, v_scale, cache_dtype, FP8_KV), mask=mask)


# ------------------------------------------------------------------------------------------------------------
# Shared device helpers
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def _load_kv_tile(k_cache_ptr, v_cache_ptr, block_table_ptr, tile_start, kv_len, kv_head_off, stride_cb, stride_ct,
                  BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr,
                  MASKED: tl.constexpr):  # fmt: skip
    """Keys ``[HEAD_P2, TILE_N]`` and values ``[TILE_N, HEAD_P2]`` at positions ``tile_start .. tile_start +
    TILE_N`` of one sequence; with ``MASKED`` positions ``>= kv_len`` read as zeros, without it the caller
    guarantees the whole tile is below ``kv_len``."""
    offs_n = tile_start + tl.arange(0, TILE_N)
    offs_d = tl.arange(0, HEAD_P2)
    n_mask = offs_n < kv_len
    if MASKED:
        page = tl.load(block_table_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
    else:
        page = tl.load(block_table_ptr + offs_n // BLOCK_SIZE)
    tok_off = page.to(tl.int64) * stride_cb + (offs_n % BLOCK_SIZE) * stride_ct + kv_head_off  # [TILE_N]
    k_ptrs = k_cache_ptr + tok_off[None, :] + offs_d[:, None]  # [HEAD_P2, TILE_N]
    v_ptrs = v_cache_ptr + tok_off[:, None] + offs_d[None, :]  # [TILE_N, HEAD_P2]
    if MASKED:
        if HEAD_SIZE == HEAD_P2:
            k = tl.load(k_ptrs, mask=n_mask[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            d_mask = offs_d < HEAD_SIZE
            k = tl.load(k_ptrs, mask=n_mask[None, :] & d_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    else:
        if HEAD_SIZE == HEAD_P2:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            d_mask = offs_d < HEAD_SIZE
            k = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
    return k, v


@triton.jit
def _attend_kv(q, acc, m_i, l_i, k, v, tile_start, kv_len, q_pos, scale_log2,
               TILE_N: tl.constexpr, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):  # fmt: skip
    """The online-softmax update of ``q`` ([M, HEAD_P2] query rows at positions ``q_pos``) with one loaded KV
    tile (``_load_kv_tile``). With ``MASKED`` keys at positions ``>= kv_len`` or ``> q_pos`` are dropped;
    without it every key of the tile is visible to every row (so no bounds or causal checks are spent)."""
    s = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * scale_log2  # [M, TILE_N] fp32, log2 units
    if MASKED:
        offs_n = tile_start + tl.arange(0, TILE_N)
        visible = (offs_n[None, :] <= q_pos[:, None]) & (offs_n < kv_len)[None, :]
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet stay exact zeros
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    k_cache_ptr,
    v_cache_ptr,
    block_table_ptr,
    tile_start,
    kv_len,
    q_pos,
    kv_head_off,
    stride_cb,
    stride_ct,
    scale_log2,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_P2: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One KV tile of the online softmax: keys ``tile_start .. tile_start + TILE_N`` of one sequence, loaded
    (``_load_kv_tile``) and attended (``_attend_kv``)."""
    k, v = _load_kv_tile(k_cache_ptr, v_cache_ptr, block_table_ptr, tile_start, kv_len, kv_head_off, stride_cb,
                         stride_ct, BLOCK_SIZE, TILE_N, HEAD_SIZE, HEAD_P2, MASKED)  # fmt: skip
    return _attend_kv(q, acc, m_i, l_i, k, v, tile_start, kv_len, q_pos, scale_log2, TILE_N, MASKED, DOT_PRECISION)


# Which sequences a unified launch attends (``seq_filter``): all of them, or only those longer (shorter) than
# ``short_query_len``: a step that mixes decodes with prompt chunks takes one launch of each, so that each decode
# gets a 16-row tile instead of the prompts' 128 rows (of which a decode fills only its GQA group's few).
SEQS_ALL: tl.constexpr = tl.constexpr(0)
SEQS_LONG: tl.constexpr = tl.constexpr(1)
SEQS_SHORT: tl.constexpr = tl.constexpr(2)


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence owning global query block ``q_block_idx``.

    Sequence ``i``'s query blocks start at global index ``query_start_loc[i] // BLOCK_Q + i`` (an upper bound
    on the blocks of the sequences before it), so a binary search over that non-decreasing sequence finds it.
    """
    lo = num_seqs * 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _decode_partition(seq_len, num_splits, TILE_N: tl.constexpr, MIN_PARTITION: tl.constexpr):
    """Keys per split of a ``seq_len``-long context: an equal share rounded up to the tile, >= the min."""
    # Plain integer arithmetic rather than tl.cdiv: nested jit calls are slow in the interpreter (tests).
    part = ((seq_len + num_splits - 1) // num_splits + TILE_N - 1) // TILE_N * TILE_N
    return tl.maximum(part, MIN_PARTITION)


# ------------------------------------------------------------------------------------------------------------
# Unified (prefill / extend / mixed) attention
# ------------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["num_seqs"])
def _unified_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    skip_ptr,
    scale_log2,
    v_scale,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bt,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HAS_SKIP: tl.constexpr,
    SEQ_FILTER: tl.constexpr,
    SHORT_QUERY_LEN: tl.constexpr,
):
    # Highest query blocks first: under the causal mask they have the most keys, so the long programs start
    # early and the short ones fill the tail.
    q_block_global = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_idx = _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    if HAS_SKIP:  # noqa: SIM102 (a constexpr: the check compiles away without it). Long chunks: long_prefill.py
        if tl.load(skip_ptr + seq_idx) != 0:
            return
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    query_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
    if SEQ_FILTER == SEQS_LONG:  # noqa: SIM102 (constexpr first: the check compiles away in the other modes)
        if query_len <= SHORT_QUERY_LEN:
            return
    if SEQ_FILTER == SEQS_SHORT:  # noqa: SIM102
        if query_len > SHORT_QUERY_LEN:
            return
    q_block = q_block_global - (q_start // BLOCK_Q + seq_idx)
    if q_block * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq_idx)
    context_len = seq_len - query_len

    # Row r of the tile: query token q_block * BLOCK_Q + r // QUERIES_PER_KV, head kv_head * QPK + r % QPK.
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_P2)
    q_in_chunk = q_block * BLOCK_Q + offs_m // QUERIES_PER_KV
    head = kv_head * QUERIES_PER_KV + offs_m % QUERIES_PER_KV
    row_mask = (offs_m < BLOCK_Q * QUERIES_PER_KV) & (q_in_chunk < query_len)
    io_mask = row_mask[:, None] & (offs_d < HEAD_SIZE)[None, :]
    q_tok = (q_start + q_in_chunk).to(tl.int64)
    q_ptrs = q_ptr + q_tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)
    q_pos = context_len + q_in_chunk  # position of each row's token in its sequence

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_P2], tl.float32)

    block_table_ptr = block_tables_ptr + seq_idx.to(tl.int64) * stride_bt
    kv_head_off = kv_head.to(tl.int64) * stride_ch
    # Keys this block needs: up to its last query token. Tiles wholly at/below its first token need no mask.
    first_pos = context_len + q_block * BLOCK_Q
    kv_len = context_len + tl.minimum((q_block + 1) * BLOCK_Q, query_len)
    num_full = (first_pos + 1) // TILE_N
    for t in range(0, num_full):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_ptr, t * TILE_N, kv_len, q_pos,
            kv_head_off, stride_cb, stride_ct, scale_log2,
            BLOCK_SIZE, TILE_N, HEAD_SIZE, HEAD_P2, False, DOT_PRECISION,
        )  # fmt: skip
    for t in range(num_full, (kv_len + TILE_N - 1) // TILE_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_ptr, t * TILE_N, kv_len, q_pos,
            kv_head_off, stride_cb, stride_ct, scale_log2,
            BLOCK_SIZE, TILE_N, HEAD_SIZE, HEAD_P2, True, DOT_PRECISION,
        )  # fmt: skip

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None] * v_scale
    tl.store(
        out_ptr + q_tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=io_mask,
    )


# ------------------------------------------------------------------------------------------------------------
# Split-KV decode attention (with this step's rotary embedding and KV-cache write)
# ------------------------------------------------------------------------------------------------------------


@triton.jit
def _head_rotary_factors(cos_ptr, sin_ptr, pos, trig_stride, offs_d, HEAD_SIZE: tl.constexpr):
    """(cos, signed sin) over a head's dims at position ``pos`` (rotate-half layout): ``_head_rows`` rotates with
    them. Loaded apart from the rows because they do not depend on the QKV projection: the table row is rarely in
    L2 (a step streams ~15 GB of weights through it), so the decode kernel reads it before its PDL wait."""
    d_mask = offs_d < HEAD_SIZE
    half: tl.constexpr = HEAD_SIZE // 2
    first = offs_d < half
    freq = tl.where(first, offs_d, offs_d - half)
    cos = tl.load(cos_ptr + pos * trig_stride + freq, mask=d_mask, other=0.0)
    sin = tl.load(sin_ptr + pos * trig_stride + freq, mask=d_mask, other=0.0)
    return cos, tl.where(first, -sin, sin)  # x1 * cos - x2 * sin | x2 * cos + x1 * sin


@triton.jit
def _head_rows(base_ptr, heads, head_stride, row_mask, offs_d, cos, sin, HEAD_SIZE: tl.constexpr,
               ROTARY: tl.constexpr):  # fmt: skip
    """Rows ``heads`` of one token ([R, HEAD_P2], the input dtype), rotated (rotate-half layout) by
    ``_head_rotary_factors`` when ``ROTARY``, rounded as the separate rotary kernel stores them."""
    d_mask = offs_d < HEAD_SIZE
    mask = row_mask[:, None] & d_mask[None, :]
    row_ptrs = base_ptr + heads[:, None] * head_stride
    x = tl.load(row_ptrs + offs_d[None, :], mask=mask, other=0.0)
    if ROTARY:
        half: tl.constexpr = HEAD_SIZE // 2
        first = offs_d < half
        partner_d = tl.where(first, offs_d + half, offs_d - half)
        partner = tl.load(row_ptrs + partner_d[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) * cos[None, :] + partner.to(tl.float32) * sin[None, :]).to(x.dtype)
    return x


@triton.jit
def _new_token_kv(k_row_ptr, v_row_ptr, kv_rows, stride_kh, stride_vh, mask, offs_d, cos, sin, k_scale, v_scale,
                  cache_dtype: tl.constexpr, HEAD_SIZE: tl.constexpr, ROTARY: tl.constexpr,
                  FP8_KV: tl.constexpr):  # fmt: skip
    """This step's key (rotated when ``ROTARY``) and value of one token, as cache entries (``_to_cache``) in rows
    ``kv_rows``."""
    k = _head_rows(k_row_ptr, kv_rows, stride_kh, mask, offs_d, cos, sin, HEAD_SIZE, ROTARY)
    v = _head_rows(v_row_ptr, kv_rows, stride_vh, mask, offs_d, cos, sin, HEAD_SIZE, False)
    return _to_cache(k, k_scale, cache_dtype, FP8_KV), _to_cache(v, v_scale, cache_dtype, FP8_KV)


@triton.jit
def _attend_new_token(q, acc, m_i, l_i, k, v, scale_log2):
    """The online-softmax update for one key ``k`` and value ``v``, each [M, HEAD_P2] with identical rows."""
    s = tl.sum(q.to(tl.float32) * k.to(tl.float32), 1) * scale_log2
    m_new = tl.maximum(m_i, s)
    p = tl.exp2(s - m_new)
    alpha = tl.exp2(m_i - m_new)
    return acc * alpha[:, None] + p[:, None] * v.to(tl.float32), m_new, l_i * alpha + p


@triton.jit
def _merge_partitions(out_ptr, stride_oh, part_out_ptr, part_lse_ptr, first_row, num_splits, num_used,
                      QUERIES_PER_KV: tl.constexpr, QPK_P2: tl.constexpr, HEAD_SIZE: tl.constexpr,
                      HEAD_P2: tl.constexpr, SPLIT_TILE: tl.constexpr):  # fmt: skip
    """The GQA group's outputs (``out_ptr`` points at its first head) from their ``num_used`` partial outputs,
    weighted by their log-sum-exps: all heads at once, ``SPLIT_TILE`` partitions per load, with an online
    rescale, so that a few partitions cost a single round trip. The partials were written by other programs of
    this launch: the loads bypass L1."""
    offs_h = tl.arange(0, QPK_P2)
    offs_t = tl.arange(0, SPLIT_TILE)
    offs_d = tl.arange(0, HEAD_P2)
    h_mask = offs_h < QUERIES_PER_KV
    rows = first_row + offs_h * num_splits  # [QPK_P2]: split 0 of each head
    m = tl.full([QPK_P2], float("-inf"), tl.float32)
    denom = tl.zeros([QPK_P2], tl.float32)
    acc = tl.zeros([QPK_P2, HEAD_P2], tl.float32)
    for s0 in range(0, num_used, SPLIT_TILE):
        mask = h_mask[:, None] & ((s0 + offs_t) < num_used)[None, :]  # [QPK_P2, SPLIT_TILE]
        part = rows[:, None] + s0 + offs_t[None, :]
        lse = tl.load(part_lse_ptr + part, mask=mask, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(part_out_ptr + part[:, :, None] * HEAD_P2 + offs_d[None, None, :], mask=mask[:, :, None],
                    other=0.0, cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m, tl.max(lse, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_use)
        weight = tl.exp2(lse - m_use[:, None])
        denom = denom * alpha + tl.sum(weight, 1)
        acc = acc * alpha[:, None] + tl.sum(weight[:, :, None] * o, 1)
        m = m_new
    out_ptrs = out_ptr + offs_h[:, None] * stride_oh + offs_d[None, :]
    out = acc / tl.where(denom == 0.0, 1.0, denom)[:, None]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=h_mask[:, None] & (offs_d < HEAD_SIZE)[None, :])


@triton.jit(do_not_specialize=["num_splits"])
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, counters_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, slot_mapping_ptr, cos_ptr, sin_ptr, pos_ptr,
    scale_log2, k_scale, v_scale, num_heads, num_kv_heads, num_splits,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_cb, stride_ct, stride_ch, stride_bt, trig_stride,
    QUERIES_PER_KV: tl.constexpr, QH_P2: tl.constexpr, QPK_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HEAD_SIZE: tl.constexpr, HEAD_P2: tl.constexpr, TILE_N: tl.constexpr, ONE_SPLIT: tl.constexpr,
    MIN_PARTITION: tl.constexpr, SPLIT_TILE: tl.constexpr, ROTARY: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PRELOAD: tl.constexpr, USE_PDL: tl.constexpr, FP8_KV: tl.constexpr, FP16_DOT: tl.constexpr,
):  # fmt: skip
    """Program (sequence, kv head, split): the GQA group's queries (rotated here) over the split's cached keys;
    the split that holds the new token takes its key and value from this step's input rather than the cache,
    and stores them in the cache (no program reads that slot, so there is no race). With several splits the
    program that finishes last, counted by an atomic per (sequence, kv head), merges the partial outputs and
    resets its counter to zero for the next launch.

    Under PDL the program reads, before it waits for the QKV projection, everything that does not depend on
    it: the step's metadata (copied in before the step's first kernel), the rotary position and the table's cos
    and sin there, the cache slot, the split counter's line (into L2, for the merge's atomic), and with
    ``PRELOAD`` the split's first KV tile (cached keys, written by earlier steps); a split beyond the
    sequence's length exits there and frees its SM for the next kernel's early start. At batch 1 that takes the
    metadata, block table and key loads off the critical path: after the wait the program loads the step's
    query, key and value (one round trip) and computes. (Larger batches skip the preload: a tile held in
    registers outside the pipelined loop costs them occupancy, and they launch without PDL.)
    """
    allow_next_kernel(USE_PDL)
    seq_idx = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    has_query = tl.load(query_start_loc_ptr + seq_idx + 1) > q_start  # padding sequences have none
    seq_len = tl.load(seq_lens_ptr + seq_idx)
    partition = _decode_partition(seq_len, num_splits, TILE_N, MIN_PARTITION)
    num_used = tl.maximum((seq_len + partition - 1) // partition, 1)
    # Split 0 always waits, so the launch never completes before the kernel it depends on.
    if split > 0 and (split >= num_used or not has_query):
        return
    start = split * partition
    end = tl.minimum(start + partition, seq_len)
    cached_end = tl.minimum(end, seq_len - 1)  # the new token, at seq_len - 1, is not read from the cache
    q_tok = q_start.to(tl.int64)
    pos = 0
    if ROTARY:
        pos = tl.load(pos_ptr + q_tok, mask=has_query, other=0)
    slot = tl.load(slot_mapping_ptr + q_tok, mask=has_query, other=-1)
    offs_d = tl.arange(0, HEAD_P2)
    cos = tl.zeros([HEAD_P2], tl.float32)
    sin = cos
    if ROTARY:
        cos, sin = _head_rotary_factors(cos_ptr, sin_ptr, pos, trig_stride, offs_d, HEAD_SIZE)
    counter = counters_ptr + seq_idx * num_kv_heads + kv_head
    if not ONE_SPLIT and num_used > 1:  # the merge's atomic on it then finds the line in L2, not HBM
        prefetch_line_to_l2(counter, USE_PDL)
    block_table_ptr = block_tables_ptr + seq_idx.to(tl.int64) * stride_bt
    kv_head_off = kv_head.to(tl.int64) * stride_ch
    if PRELOAD:
        first_end = tl.minimum(start + TILE_N, cached_end)
        first_k, first_v = _load_kv_tile(
            k_cache_ptr, v_cache_ptr, block_table_ptr, start, first_end, kv_head_off, stride_cb, stride_ct,
            BLOCK_SIZE, TILE_N, HEAD_SIZE, HEAD_P2, True,
        )  # fmt: skip
    wait_for_previous_kernel(USE_PDL)
    if not has_query:
        return

    offs_h = tl.arange(0, QH_P2)
    head = kv_head * QUERIES_PER_KV + offs_h
    h_mask = offs_h < QUERIES_PER_KV
    io_mask = h_mask[:, None] & (offs_d < HEAD_SIZE)[None, :]
    holds_new_token = (end == seq_len) & (seq_len > 0)  # seq_len 0: an empty row
    q = _head_rows(q_ptr + q_tok * stride_qt, head, stride_qh, h_mask, offs_d, cos, sin, HEAD_SIZE, ROTARY)
    if FP16_DOT:  # the tiles' products in fp16 (``decode_attention`` says when and why)
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    kv_rows = kv_head + offs_h * 0  # every row is this kv head: the new key broadcasts over the query rows
    new_mask = h_mask & ((offs_h * 0 + holds_new_token) != 0)  # a tensor: the interpreter masks with tensors only
    if PRELOAD:  # batch 1: the new key and value in the query's round trip
        new_k, new_v = _new_token_kv(k_ptr + q_tok * stride_kt, v_ptr + q_tok * stride_vt, kv_rows, stride_kh,
                                     stride_vh, new_mask, offs_d, cos, sin, k_scale, v_scale,
                                     k_cache_ptr.dtype.element_ty, HEAD_SIZE, ROTARY, FP8_KV)  # fmt: skip
    q_pos = tl.full([QH_P2], 0, tl.int32) + (seq_len - 1)

    m_i = tl.full([QH_P2], float("-inf"), tl.float32)
    l_i = tl.zeros([QH_P2], tl.float32)
    acc = tl.zeros([QH_P2, HEAD_P2], tl.float32)
    rest = start
    if PRELOAD:
        acc, m_i, l_i = _attend_kv(q, acc, m_i, l_i, first_k, first_v, start, first_end, q_pos, scale_log2, TILE_N,
                                   True, DOT_PRECISION)  # fmt: skip
        rest = start + TILE_N
    # Whole tiles (no masks), then the last partial tile of cached keys, if it falls in this split.
    full_end = rest + tl.maximum(cached_end - rest, 0) // TILE_N * TILE_N
    for t in range(rest, full_end, TILE_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_ptr, t, cached_end, q_pos,
            kv_head_off, stride_cb, stride_ct, scale_log2,
            BLOCK_SIZE, TILE_N, HEAD_SIZE, HEAD_P2, False, DOT_PRECISION,
        )  # fmt: skip
    if full_end < cached_end:
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, block_table_ptr, full_end, cached_end, q_pos,
            kv_head_off, stride_cb, stride_ct, scale_log2,
            BLOCK_SIZE, TILE_N, HEAD_SIZE, HEAD_P2, True, DOT_PRECISION,
        )  # fmt: skip
    if holds_new_token:
        if not PRELOAD:  # larger batches load them here, so that the pipelined loop does not carry them
            new_k, new_v = _new_token_kv(k_ptr + q_tok * stride_kt, v_ptr + q_tok * stride_vt, kv_rows, stride_kh,
                                         stride_vh, new_mask, offs_d, cos, sin, k_scale, v_scale,
                                         k_cache_ptr.dtype.element_ty, HEAD_SIZE, ROTARY, FP8_KV)  # fmt: skip
        acc, m_i, l_i = _attend_new_token(q, acc, m_i, l_i, new_k, new_v, scale_log2)
        if slot >= 0:  # -1: a padding row, nothing to store
            dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_ct + kv_head_off + offs_d
            store_mask = (offs_h == 0)[:, None] & io_mask
            tl.store(k_cache_ptr + dst[None, :] + offs_h[:, None] * 0, new_k, mask=store_mask)
            tl.store(v_cache_ptr + dst[None, :] + offs_h[:, None] * 0, new_v, mask=store_mask)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None] * v_scale  # partial outputs too: the merge is linear in them
    out_ptrs = out_ptr + q_tok * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    if ONE_SPLIT:  # noqa: SIM114 (compile-time, then run-time: no partials for one used split)
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)
    elif num_used == 1:
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        # part_out: [seqs, num_heads, num_splits, HEAD_P2] fp32; part_lse: [seqs, num_heads, num_splits].
        row = (seq_idx.to(tl.int64) * num_heads + head) * num_splits  # [QH_P2], split 0 of each head
        tl.store(part_out_ptr + (row + split)[:, None] * HEAD_P2 + offs_d[None, :], out, mask=h_mask[:, None])
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe))
        tl.store(part_lse_ptr + row + split, lse, mask=h_mask)
        tl.debug_barrier()  # every thread's partial stores come before the release below
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_used - 1:  # the last split to finish
            # Reset for the next launch (ordered after this one by the kernel boundary): a plain store, issued
            # before the merge so that nothing waits on it.
            tl.store(counter, 0)
            first_head = kv_head * QUERIES_PER_KV
            _merge_partitions(
                out_ptr + q_tok * stride_ot + first_head * stride_oh, stride_oh, part_out_ptr, part_lse_ptr,
                (seq_idx.to(tl.int64) * num_heads + first_head) * num_splits, num_splits, num_used,
                QUERIES_PER_KV, QPK_P2, HEAD_SIZE, HEAD_P2, SPLIT_TILE,
            )  # fmt: skip


# ------------------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------------------

# Decode heuristics: program slots per SM that a split launch fills once (see decode_num_splits), no split
# shorter than this many keys, and at most this many splits. Measured on the H200 (8B shape,
# benchmarks/tune_decode_attention.py): splitting only pays when the batch leaves SMs idle, e.g. 64 sequences x
# 1,800 keys run 12% faster unsplit.
DECODE_PROGRAMS_PER_SM = 2
DECODE_MIN_PARTITION = 128
DECODE_MAX_SPLITS = 128
# Split decode launches merge their partitions in the kernel, with one counter per (sequence, kv head). The
# heuristic only splits batches of fewer than DECODE_PROGRAMS_PER_SM * SMs such groups, far below this.
MAX_SPLIT_DECODE_GROUPS = 8192
# 128-key tiles with 3 pipeline stages keep more loads in flight (3.70 vs 3.61 TB/s at 256 x 820 keys), but
# need about 192 KB of shared memory for 128-wide heads: Hopper-class GPUs only. An FP8 cache's 128-key tiles in
# 2 stages hold 64 KB of keys and values: Ada's 99 KB a block has room for them.
_LARGE_DECODE_TILE_SMEM = 200 * 1024
_FP8_DECODE_TILE_SMEM = 96 * 1024


def _fits(device: torch.device, needed: int) -> bool:
    """Whether a launch needing ``needed`` bytes of shared memory a block fits; always off a GPU (the
    interpreter has no limit), so that the CPU tests run the FP8 launch."""
    limit = shared_memory_per_block(device)
    return limit == 0 or limit >= needed


class DecodeLaunch(NamedTuple):
    """The decode kernel's launch defaults for a batch (``decode_attention``'s arguments override them)."""

    tile_n: int  # keys per tile
    num_stages: int
    min_partition: int  # fewest keys per split
    num_warps: int


def _decode_launch(head_p2: int, num_seqs: int, device: torch.device, fp8: bool = False) -> DecodeLaunch:
    """A single sequence's launch is latency-bound:
    - small tiles and 64-key splits: on the H200 W3 ran at 240 to 243 tok/s that way against 236 with the large
      tiles (benchmarks/results/HISTORY.md, fourth run);
    - no pipeline stages: its splits are mostly one tile long, so its loop rarely runs and stages only cost it
      setup (0.6 us per layer, W3 259.2 vs 258.4);
    - 8 warps, which halve each thread's share of the tile math (W3 261 vs 258 tok/s).
    An FP8 cache (``fp8``) at batch 1 takes 128-key tiles, 2 stages and 4 warps instead: over 32,000 keys 55.9 us
    against 94.9 with the bf16 launch (``tune_decode_attention.py --kv-cache-dtype fp8``, nineteenth run), its
    8-bit tiles carrying half the bytes of bf16's. Larger batches keep 4 warps, which leaves more programs per
    SM."""
    if num_seqs > 1 and head_p2 <= 128 and shared_memory_per_block(device) >= _LARGE_DECODE_TILE_SMEM:
        return DecodeLaunch(128, 3, DECODE_MIN_PARTITION, 4)
    small_tile = 64 if head_p2 <= 128 else 32
    if num_seqs == 1 and fp8 and head_p2 <= 128 and _fits(device, _FP8_DECODE_TILE_SMEM):
        return DecodeLaunch(128, 2, 128, 4)
    if num_seqs == 1:
        return DecodeLaunch(small_tile, 1, 64, 8)
    return DecodeLaunch(small_tile, 2, DECODE_MIN_PARTITION, 4)


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not silently drop to tf32 on the GPU; for 16-bit inputs the setting has no effect.
    return "ieee" if dtype == torch.float32 else "tf32"


def _is_fp8(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == torch.float8_e4m3fn


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Fused scatter of ``key``/``value`` ([num_tokens, num_kv_heads, head_size]) into ``kv_cache`` slots (an FP8
    cache gets them divided by ``k_scale`` / ``v_scale``)."""
    num_tokens, num_kv_heads, head_size = key.shape
    if num_tokens == 0:
        return
    key, value = _last_dim_contiguous(key), _last_dim_contiguous(value)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    assert k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    head_p2 = triton.next_power_of_2(head_size)
    block_h = max(1, min(triton.next_power_of_2(num_kv_heads), 4096 // head_p2))
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    _write_kv_cache_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping,
        num_kv_heads, key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), k_scale, v_scale,
        BLOCK_SIZE=kv_cache.shape[2], HEAD_SIZE=head_size, HEAD_P2=head_p2, BLOCK_H=block_h,
        FP8_KV=_is_fp8(kv_cache), num_warps=4 if block_h * head_p2 >= 1024 else 1,
    )  # fmt: skip


def rope_and_write_kv_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Rotary embedding of ``query`` and ``key`` (in place, rotate-half layout) and the cache write of the rotated
    keys and of ``value``, in one launch: ``apply_rotary`` followed by ``write_kv_cache``."""
    num_tokens, num_heads, head_size = query.shape
    if num_tokens == 0:
        return
    num_kv_heads = key.shape[1]
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    assert query.stride(-1) == key.stride(-1) == value.stride(-1) == 1 and cos.is_contiguous()
    assert k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    _rope_and_write_kv_kernel[(num_tokens,)](
        query, key, value, k_cache, v_cache, cos, sin, positions, slot_mapping,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0), k_scale, v_scale,
        NUM_Q_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, Q_HEADS_P2=triton.next_power_of_2(num_heads),
        KV_HEADS_P2=triton.next_power_of_2(num_kv_heads), HALF=head_size // 2,
        HALF_P2=triton.next_power_of_2(head_size // 2), BLOCK_SIZE=kv_cache.shape[2], FP8_KV=_is_fp8(kv_cache),
        num_warps=4,
    )  # fmt: skip


# Rows from which a sequence takes the unified kernel's 64-row tile rather than its smallest (16 rows).
_MEDIUM_TILE_ROWS = 64


def short_query_len(queries_per_kv: int) -> int:
    """The longest query a sequence may have to count as short: its rows (query tokens x GQA group) would take
    the smallest tile of :func:`_unified_config` on their own."""
    return max(1, (_MEDIUM_TILE_ROWS - 1) // queries_per_kv)


def _unified_config(head_p2: int, queries_per_kv: int, max_query_len: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, TILE_N, num_warps, num_stages) for the unified kernel. The 128-row tile is the H200's best for
    the 8B shape's long chunks (``benchmarks/tune_prefill_attention.py``: 413 TFLOP/s with 4 warps, 339 with 8);
    the smaller ones are leads to verify."""
    rows = max_query_len * queries_per_kv  # rows a sequence can fill
    if rows >= 128 and head_p2 <= 128:
        block_m, tile_n, warps, stages = 128, 64, 4, 3
    elif rows >= _MEDIUM_TILE_ROWS:
        block_m, tile_n, warps, stages = (64, 64, 4, 3) if head_p2 <= 128 else (64, 32, 8, 3)
    else:
        block_m, tile_n, warps, stages = 16, 64 if head_p2 <= 128 else 32, 4, 2
    return max(block_m, triton.next_power_of_2(queries_per_kv)), tile_n, warps, stages


def unified_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    num_seqs: int,
    max_query_len: int,
    *,
    block_m: int | None = None,
    tile_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    skip_seqs: torch.Tensor | None = None,
    seq_filter: int = SEQS_ALL.value,
) -> torch.Tensor:
    """Causal attention of packed query tokens over their sequences' pages (the cache holds this step's KV; an
    FP8 cache's entries times ``k_scale`` / ``v_scale``). Sequences flagged nonzero in ``skip_seqs`` ([num_seqs]
    int32, on the device) are left out: their output rows are not written. ``seq_filter`` ``SEQS_LONG`` /
    ``SEQS_SHORT`` leaves out the sequences whose query is at most / more than :func:`short_query_len` tokens
    (read on the device, so a CUDA graph can hold both launches); ``max_query_len`` is then that of the
    sequences attended, and it picks the tile.

    ``query``/``output``: [num_tokens, num_heads, head_size] (last dim contiguous; other strides free).
    ``block_m`` (rows per program, a power of two >= 16 and >= the GQA group) and ``tile_n`` (keys per
    iteration, a power of two >= 16), ``num_warps`` and ``num_stages`` override the heuristic (tests, tuning).
    """
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    assert num_heads % num_kv_heads == 0 and output.stride(-1) == 1
    if num_tokens == 0 or num_seqs == 0:
        return output
    query = _last_dim_contiguous(query)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    assert k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    qpk = num_heads // num_kv_heads
    head_p2 = max(16, triton.next_power_of_2(head_size))
    cfg_m, cfg_n, warps, stages = _unified_config(head_p2, qpk, max_query_len)
    block_m, tile_n = block_m or cfg_m, tile_n or cfg_n
    warps, stages = num_warps or warps, num_stages or stages
    assert block_m >= qpk and block_m >= 16 and tile_n >= 16
    block_q = block_m // qpk
    # Sum over sequences of cdiv(query_len, block_q) <= num_tokens // block_q + num_seqs: a host-only bound.
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _unified_attention_kernel[grid](
        query, k_cache, v_cache, output, block_tables, seq_lens, query_start_loc,
        skip_seqs if skip_seqs is not None else seq_lens, scale * LOG2E * k_scale, v_scale, num_seqs,
        query.stride(0), query.stride(1), output.stride(0), output.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=qpk, BLOCK_SIZE=block_size, HEAD_SIZE=head_size, HEAD_P2=head_p2,
        BLOCK_M=block_m, BLOCK_Q=block_q, TILE_N=tile_n, DOT_PRECISION=_dot_precision(query.dtype),
        HAS_SKIP=skip_seqs is not None, SEQ_FILTER=seq_filter, SHORT_QUERY_LEN=short_query_len(qpk),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return output


def decode_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, device: torch.device) -> int:
    """How many partitions a decode batch's contexts are cut into (host-only inputs, so graph-safe): as many as
    fill the device's program slots once, and never more. One split past that starts a second wave of a few
    programs that runs after the first on a few SMs: at batch 8 with 8 KV heads the old rounding up (5 splits,
    320 programs for 264 slots of an H200) left most of the GPU idle for the last programs."""
    base = max(1, num_seqs * num_kv_heads)
    wanted = DECODE_PROGRAMS_PER_SM * num_sms(device) // base
    useful = triton.cdiv(max(1, max_seq_len), DECODE_MIN_PARTITION)
    return max(1, min(wanted, useful, DECODE_MAX_SPLITS))


@functools.cache
def _split_counters(device: torch.device) -> torch.Tensor:
    """Zeroed int32 counters, one per (sequence, kv head) of a split decode launch, that every launch leaves
    zeroed. Allocated once per device, on the first decode launch (a CUDA graph's warm-up, before capture), so
    that every captured graph holds the same address."""
    return torch.zeros(MAX_SPLIT_DECODE_GROUPS, dtype=torch.int32, device=device)


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    *,
    num_splits: int | None = None,
    tile_n: int | None = None,
    min_partition: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Split-KV attention for a decode-only batch (each sequence has at most one query token), which also
    stores this step's ``key``/``value`` in ``kv_cache`` at ``metadata.slot_mapping``: one launch per layer.

    ``rotary = (cos, sin, positions)`` rotates the queries and keys first (rotate-half layout, as
    ``apply_rotary``); the cache then holds the rotated keys. ``metadata.max_seq_len`` is a host-side upper
    bound on ``seq_lens`` and only shapes the grid; the partition of each sequence is computed in the kernel from
    its own length. ``num_splits``, ``tile_n``, ``min_partition``, ``num_warps`` and ``num_stages`` override the
    heuristics (tests, tuning). Nothing here reads device data on the host.
    """
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    num_seqs = metadata.num_seqs
    assert num_heads % num_kv_heads == 0 and output.stride(-1) == 1
    if num_tokens == 0 or num_seqs == 0:
        return output
    query, key, value = (_last_dim_contiguous(t) for t in (query, key, value))
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    assert k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    qpk = num_heads // num_kv_heads
    head_p2 = max(16, triton.next_power_of_2(head_size))
    default = _decode_launch(head_p2, num_seqs, query.device, _is_fp8(kv_cache))
    tile_n, num_stages = tile_n or default.tile_n, num_stages or default.num_stages
    num_warps = num_warps or default.num_warps
    min_partition = triton.cdiv(min_partition or default.min_partition, tile_n) * tile_n
    if num_splits is None:
        num_splits = decode_num_splits(num_seqs, num_kv_heads, metadata.max_seq_len, query.device)
    counters = _split_counters(query.device)
    if num_splits == 1:
        part_out = part_lse = output  # unused
    else:
        assert num_seqs * num_kv_heads <= counters.numel(), "more split decode groups than counters"
        f32 = dict(dtype=torch.float32, device=query.device)
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_p2, **f32)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, **f32)
    cos, sin, positions = rotary if rotary is not None else (query, query, metadata.slot_mapping)
    assert cos.stride(-1) == 1
    qpk_p2 = triton.next_power_of_2(qpk)
    # The merge holds [heads of a group, SPLIT_TILE partitions, head_p2] fp32 values: about 32 per thread.
    split_tile = max(1, min(triton.next_power_of_2(num_splits), 32 * 32 * num_warps // (qpk_p2 * head_p2)))
    # A bf16 step over an FP8 cache multiplies its tiles in fp16 (the query clamped to fp16's range once; cached
    # values are at most 448 and probabilities at most 1): the cache widens to fp16 in one instruction a pair of
    # values, to bf16 only through float32, and on the H200 that conversion bound the kernel: 8 x 32,000 keys
    # in 200.6 against 272.8 us, 256 x 820 in 221.2 against 282.6 (twentieth run). Batch 1 keeps bf16: its own
    # launch ran 2x slower in fp16 (113.1 against 58.6 us over 32,000 keys).
    fp16_dot = _is_fp8(kv_cache) and query.dtype == torch.bfloat16 and num_seqs > 1
    _decode_attention_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key, value, k_cache, v_cache, output, part_out, part_lse, counters,
        metadata.block_tables, metadata.seq_lens, metadata.query_start_loc, metadata.slot_mapping, cos, sin, positions,
        scale * LOG2E * k_scale, k_scale, v_scale, num_heads, num_kv_heads, num_splits,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        output.stride(0), output.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        metadata.block_tables.stride(0), cos.stride(0),
        QUERIES_PER_KV=qpk, QH_P2=max(16, qpk_p2), QPK_P2=qpk_p2, BLOCK_SIZE=block_size, HEAD_SIZE=head_size,
        HEAD_P2=head_p2, TILE_N=tile_n, ONE_SPLIT=num_splits == 1, MIN_PARTITION=min_partition, SPLIT_TILE=split_tile,
        ROTARY=rotary is not None, DOT_PRECISION=_dot_precision(query.dtype), PRELOAD=num_seqs == 1,
        FP8_KV=_is_fp8(kv_cache), FP16_DOT=fp16_dot, num_warps=num_warps, num_stages=num_stages,
        **pdl_launch_options(query.device, num_seqs),
    )  # fmt: skip
    return output
