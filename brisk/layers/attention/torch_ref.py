"""Reference attention: gathers each sequence's pages and calls SDPA. Slow, obviously right, runs anywhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brisk.layers.attention.backend import AttentionImpl, AttentionMetadata, gather_pages
from brisk.layers.quantization.kv_cache import dequantize_kv, is_fp8


class TorchAttentionImpl(AttentionImpl):
    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        if metadata.is_decode_only and metadata.num_seqs > 1:
            return self._decode_batched(query, kv_cache, metadata)
        block_size = kv_cache.shape[2]
        output = torch.empty_like(query)
        starts = metadata.query_start_loc_cpu
        for i, seq_len in enumerate(metadata.seq_lens_cpu):
            q_start, q_end = starts[i], starts[i + 1]
            query_len = q_end - q_start
            if query_len == 0:
                continue
            num_blocks = -(-seq_len // block_size)
            blocks = metadata.block_tables[i, :num_blocks].long()
            # One index_select for keys and values: advanced indexing costs twice as much per call on CPU.
            k, v = self._read(gather_pages(kv_cache, blocks).flatten(1, 2)[:, :seq_len], query.dtype)
            q = query[q_start:q_end]
            # Query row r sits at position (seq_len - query_len + r) and sees keys up to and including it. A
            # single query sees every key and a whole prompt is plain causal: no mask tensor, so SDPA may take
            # its fused kernels; a chunk after cached tokens needs the offset mask.
            if query_len == 1:
                output[q_start:q_end] = self._single_query(q, k, v)
                continue
            mask, causal = None, query_len == seq_len
            if query_len < seq_len:
                q_pos = torch.arange(seq_len - query_len, seq_len, device=query.device)
                mask = torch.arange(seq_len, device=query.device)[None, :] <= q_pos[:, None]
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1).to(k.dtype),
                k.transpose(0, 1),
                v.transpose(0, 1),
                attn_mask=mask,
                is_causal=causal,
                scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads,
            )
            output[q_start:q_end] = out.transpose(0, 1).to(output.dtype)
        return output

    def _read(self, kv: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Gathered keys and values (``kv[0]``, ``kv[1]``); an FP8 cache's dequantized into ``dtype``."""
        if not is_fp8(kv):
            return kv[0], kv[1]
        return dequantize_kv(kv[0], self.k_scale, dtype), dequantize_kv(kv[1], self.v_scale, dtype)

    def _single_query(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One query token ([1, heads, head]) over all of its keys ([seq_len, kv_heads, head]). The query heads of
        a GQA group become that group's query rows, so SDPA runs without repeating KV heads and without a mask,
        which lets it take its fused kernel (on CPU about half the time of the GQA path)."""
        kv_heads, head_size = k.shape[1], k.shape[2]
        grouped = q.reshape(kv_heads, -1, head_size).to(k.dtype)  # head h belongs to kv head h // group
        out = F.scaled_dot_product_attention(grouped, k.transpose(0, 1), v.transpose(0, 1), scale=self.scale)
        return out.reshape(1, -1, head_size).to(q.dtype)

    def _decode_batched(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        """All sequences of a decode step in one SDPA call over their pages, padded to the longest context."""
        block_size = kv_cache.shape[2]
        num_blocks = -(-metadata.max_seq_len // block_size)
        tables = metadata.block_tables[: metadata.num_seqs, :num_blocks].long()
        pages = gather_pages(kv_cache, tables.flatten()).unflatten(1, tables.shape).flatten(2, 3)
        if is_fp8(kv_cache):
            pages = torch.stack(self._read(pages, query.dtype))
        positions = torch.arange(pages.shape[2], device=query.device)
        valid = positions[None, :] < metadata.seq_lens[: metadata.num_seqs, None]  # [seqs, padded_len]
        # Padding slots may hold anything (stale or never-written values): zero them, masking alone keeps NaN.
        # In place on the fresh, contiguous gather (one pass for keys and values, not two strided copies).
        pages.masked_fill_(~valid[None, :, :, None, None], 0)
        k, v = pages.transpose(2, 3)  # each [seqs, kv_heads, padded_len, head]
        mask = valid[:, None, None, :]  # [seqs, 1, 1, padded_len]
        out = F.scaled_dot_product_attention(
            query[:, :, None, :].to(k.dtype),  # [seqs, heads, 1, head]
            k,
            v,
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return out[:, :, 0, :].to(query.dtype)
