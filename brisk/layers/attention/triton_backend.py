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
        return tk.unified_attention(
            query,
            kv_cache,
            output,
            metadata.block_tables,
            metadata.seq_lens,
            metadata.query_start_loc,
            self.scale,
            metadata.num_seqs,
            metadata.max_query_len,
            k_scale=k_scale,
            v_scale=v_scale,
            skip_seqs=skip,
        )
