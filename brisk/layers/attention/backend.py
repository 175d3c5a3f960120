"""The attention backend interface.

Every backend reads the same per-step metadata (built once per step by the model runner) and the same paged KV
cache layout, so backends are interchangeable and the torch reference can check the fast ones.

KV cache layout, one tensor per layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (index 0 keys,
1 values). Token ``t`` of a sequence lives in block ``block_table[t // block_size]`` at offset
``t % block_size``; its flat slot is ``block_id * block_size + offset`` (what ``slot_mapping`` holds).

Query tokens of one step are packed: sequence ``i`` owns rows ``query_start_loc[i]:query_start_loc[i + 1]`` of
``q``; they are the last ``query_len`` tokens of its ``seq_lens[i]`` context tokens, so they attend causally to
everything before them (cached prefix blocks included).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from brisk.layers.quantization.kv_cache import DEFAULT_KV_SCALE, is_fp8, quantize_kv
from brisk.layers.rotary import RotaryEmbedding


@dataclass
class AttentionMetadata:
    """Everything an attention layer needs about the current step's batch (same for every layer)."""

    num_tokens: int
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, on device
    seq_lens: torch.Tensor  # [num_seqs] int32, context length after this step, on device
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, on device (padding = 0)
    slot_mapping: torch.Tensor  # [num_tokens] int64, on device; -1 means "do not write" (padding)
    # Host copies, so backends that loop in Python never sync with the device.
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]
    # A CUDA graph's step (its capture, or the eager pass before it that compiles its kernels): the kernels it
    # launches must not depend on lengths only the host knows, since a replay serves other lengths.
    for_graph: bool = False

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @functools.cached_property
    def min_query_len(self) -> int:
        """The shortest query of the step, from the host copy: computed once a step, then read by every layer."""
        starts = self.query_start_loc_cpu
        return min(end - start for start, end in zip(starts, starts[1:]))


class AttentionImpl:
    """One attention layer's computation over the paged cache. Backends implement :meth:`attend`; one that fuses
    the rotary embedding or the cache write into its kernels overrides :meth:`forward` instead."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.scale = scale
        # An FP8 cache stores key / scale and value / scale (set from the checkpoint's k_scale and v_scale).
        self.k_scale = self.v_scale = DEFAULT_KV_SCALE

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_size]
        metadata: AttentionMetadata,
        rotary_emb: RotaryEmbedding | None = None,
        positions: torch.Tensor | None = None,  # [num_tokens], with rotary_emb
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_size]
        """Rotate ``query``/``key`` by ``rotary_emb`` at ``positions`` (when given), write ``key``/``value``
        into ``kv_cache`` at ``metadata.slot_mapping``, then attend."""
        if rotary_emb is not None:
            query, key = rotary_emb(positions, query, key)
        write_kv_cache(key, value, kv_cache, metadata.slot_mapping, self.k_scale, self.v_scale)
        return self.attend(query, kv_cache, metadata)

    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """Attention of the step's (rotated) queries over a cache that already holds the step's keys and values."""
        raise NotImplementedError(f"{type(self).__name__} must implement attend() or override forward()")


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = DEFAULT_KV_SCALE,
    v_scale: float = DEFAULT_KV_SCALE,
) -> None:
    """Scatter this step's keys and values into their cache slots (the reference for fused writers); an FP8
    cache gets them divided by ``k_scale`` / ``v_scale``."""
    num_blocks, block_size = kv_cache.shape[1], kv_cache.shape[2]
    flat = kv_cache.view(2, num_blocks * block_size, *kv_cache.shape[3:])
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    if is_fp8(kv_cache):  # copied as bytes: index_copy_ has no float8 kernel on the CPU
        flat = flat.view(torch.uint8)
        key, value = quantize_kv(key, k_scale).view(torch.uint8), quantize_kv(value, v_scale).view(torch.uint8)
    flat[0].index_copy_(0, slot_mapping, key.to(flat.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(flat.dtype))


def gather_pages(kv_cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Blocks ``blocks`` of the cache (keys and values), gathered in one ``index_select`` (as bytes for FP8,
    which has no CPU gather kernel)."""
    if is_fp8(kv_cache):
        return kv_cache.view(torch.uint8).index_select(1, blocks).view(kv_cache.dtype)
    return kv_cache.index_select(1, blocks)
