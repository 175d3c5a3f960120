"""Triton attention backend: fused KV-cache writer, unified prefill/extend kernel, split-KV decode kernel."""

from __future__ import annotations

import torch

from brisk.layers.attention import triton_kernels as tk
from brisk.layers.attention.backend import AttentionImpl, AttentionMetadata
from brisk.layers.attention.long_prefill import long_chunk_seqs, long_prefill_attention
from brisk.layers.rotary import RotaryEmbedding


class TritonAttentionImpl(AttentionImpl):
    """Paged attention through brisk's Triton kernels (``triton_kernels.py``). The rotary embedding is applied in
    the kernel that stores the step's keys and values.

    Decode-only steps (``metadata.max_query_len == 1``) take the split-KV decode kernel, which also rotates and
    stores the step's keys: one launch per layer, reading only host-side metadata (``num_seqs``,
    ``max_seq_len``) and shapes, so it can be captured in a CUDA graph. Every other step (prefill chunks with
    cached prefixes, mixed prefill + decode, speculative 1 + k) writes the cache, then takes the unified kernel;
    chunks of at least 2,048 tokens take cuDNN's fused attention instead (``long_prefill.py``), the unified kernel
    skipping their sequences.
    """

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        rotary_emb: RotaryEmbedding | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        k_scale, v_scale = self.k_scale, self.v_scale
        if metadata.is_decode_only:
            rotary = (rotary_emb.cos, rotary_emb.sin, positions) if rotary_emb is not None else None
            return tk.decode_attention(
                query, key, value, kv_cache, output, metadata, self.scale, rotary, k_scale=k_scale, v_scale=v_scale
            )
        if rotary_emb is None:
            tk.write_kv_cache(key, value, kv_cache, metadata.slot_mapping, k_scale, v_scale)
        else:
            cos, sin = rotary_emb.cos, rotary_emb.sin
            tk.rope_and_write_kv_cache(
                positions, query, key, value, cos, sin, kv_cache, metadata.slot_mapping, k_scale, v_scale
            )
        skip = None
        long = long_chunk_seqs(query, metadata)
        if long:
            long_prefill_attention(query, kv_cache, output, metadata, long, self.scale, k_scale, v_scale)
            if len(long) == metadata.num_seqs:
                return output
            skip = torch.zeros(metadata.num_seqs, dtype=torch.int32)
            skip[long] = 1
            skip = skip.to(query.device)
        args = (query, kv_cache, output, metadata.block_tables, metadata.seq_lens, metadata.query_start_loc)
        short = tk.short_query_len(self.num_heads // self.num_kv_heads)
        if not _mixes_short_and_long(metadata, short):
            return tk.unified_attention(*args, self.scale, metadata.num_seqs, metadata.max_query_len,
                                        k_scale=k_scale, v_scale=v_scale, skip_seqs=skip)  # fmt: skip
        tk.unified_attention(*args, self.scale, metadata.num_seqs, metadata.max_query_len, k_scale=k_scale,
                             v_scale=v_scale, skip_seqs=skip, seq_filter=tk.SEQS_LONG.value)  # fmt: skip
        return tk.unified_attention(*args, self.scale, metadata.num_seqs, short, k_scale=k_scale, v_scale=v_scale,
                                    seq_filter=tk.SEQS_SHORT.value)  # fmt: skip


def _mixes_short_and_long(metadata: AttentionMetadata, short: int) -> bool:
    """Whether a step's sequences include both queries of at most ``short`` tokens (decodes, drafts) and longer
    ones (prompt chunks), which then take a launch each: one tile size for both would give each decode the
    prompts' 128-row tile, 32 times the work its few rows need (at 250 decodes beside prompts on an 8B model,
    about 10 ms a step). The packed mixed-step graphs are captured with empty sequences beside their padding
    one, so they hold both launches for whatever they replay; a graph's compiling pass and its capture see the
    same metadata, so no kernel is first compiled inside a capture."""
    if metadata.num_seqs < 2 or metadata.max_query_len <= short:
        return False
    return metadata.min_query_len <= short
