"""FlashInfer attention over brisk's paged KV cache: optional, used only when selected and ``flashinfer`` imports.

brisk's cache ``[2, num_blocks, block_size, num_kv_heads, head_size]`` is FlashInfer's NHD layout given as a
(keys, values) pair of page tensors, so the two backends share the cache and the KV manager. One paged-prefill
wrapper serves every step: FlashInfer's causal mask aligns a sequence's queries with the end of its context,
which is brisk's rule for whole prompts, chunks on cached prefixes and decode rows alike. Planning (page lists
and work split, a host step) happens once per step, by the first layer that sees the step's metadata; the other
layers reuse it. The rotary embedding and the cache write are brisk's own ops.

Steps run eagerly with this backend (no CUDA graphs): a replayed graph would skip the per-step planning.
FlashInfer computes in fp16 or bf16 only.
"""

from __future__ import annotations

import itertools

import flashinfer
import torch

from brisk.device_transfer import to_device_async
from brisk.layers.attention.backend import AttentionImpl, AttentionMetadata

WORKSPACE_BYTES = 128 << 20  # FlashInfer's recommended split-KV workspace


class _StepPlanner:
    """The wrapper of one device and the step it was last planned for (shared by every layer)."""

    def __init__(self, device: torch.device):
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
        self._planned_for: AttentionMetadata | None = None

    def plan(self, metadata: AttentionMetadata, impl: AttentionImpl, kv_cache: torch.Tensor, dtype: torch.dtype):
        if self._planned_for is metadata:
            return
        block_size = kv_cache.shape[2]
        pages = [-(-n // block_size) for n in metadata.seq_lens_cpu]
        # Sequence i's pages are the first pages[i] entries of its block-table row: one gather on the device.
        index = to_device_async(
            [[i for i, n in enumerate(pages) for _ in range(n)], [c for n in pages for c in range(n)]],
            torch.int64,
            kv_cache.device,
        )
        page_ids = metadata.block_tables[index[0], index[1]]
        self.wrapper.plan(
            torch.tensor(metadata.query_start_loc_cpu, dtype=torch.int32),
            torch.tensor([0, *itertools.accumulate(pages)], dtype=torch.int32),
            page_ids,
            torch.tensor([n - (p - 1) * block_size for n, p in zip(metadata.seq_lens_cpu, pages)], dtype=torch.int32),
            impl.num_heads,
            impl.num_kv_heads,
            impl.head_size,
            block_size,
            causal=True,
            sm_scale=impl.scale,
            q_data_type=dtype,
            kv_data_type=kv_cache.dtype,
        )
        self._planned_for = metadata


_planners: dict[torch.device, _StepPlanner] = {}


class FlashInferAttentionImpl(AttentionImpl):
    def attend(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        planner = _planners.get(kv_cache.device)
        if planner is None:
            planner = _planners[kv_cache.device] = _StepPlanner(kv_cache.device)
        planner.plan(metadata, self, kv_cache, query.dtype)
        return planner.wrapper.run(query.contiguous(), (kv_cache[0], kv_cache[1]))
