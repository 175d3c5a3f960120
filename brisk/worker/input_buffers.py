"""Persistent per-step input buffers: filled on the host, copied to the device in one non-blocking batch.

Keeping them allocated for the engine's life means no per-step allocation, pinned host memory on GPUs (so the
copies are asynchronous), and fixed device addresses, which CUDA graphs need for their inputs. With async
scheduling the host fills step N+1 while step N's copies may still be queued, so filling first waits for the
previous copies (an event that has almost always fired by then).
"""

from __future__ import annotations

import numpy as np
import torch

from brisk.layers.attention.backend import AttentionMetadata


def to_device_async(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on the device without blocking the host (pinned staging memory on GPUs)."""
    if device.type == "cpu":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)


class InputBuffers:
    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device: torch.device):
        self.device = device
        pin = device.type == "cuda"

        def host(*shape, dtype):
            return torch.zeros(shape, dtype=dtype, pin_memory=pin)

        self.input_ids = host(max_tokens, dtype=torch.int64)
        self.positions = host(max_tokens, dtype=torch.int64)
        self.slot_mapping = host(max_tokens, dtype=torch.int64)
        self.seq_lens = host(max_seqs, dtype=torch.int32)
        self.query_start_loc = host(max_seqs + 1, dtype=torch.int32)
        self.block_table = host(max_seqs, max_blocks_per_seq, dtype=torch.int32)
        # Rows of (destination token index, source row of the previous step's sampled ids), see feed_sampled.
        self.feed_index = host(2, max_seqs, dtype=torch.int64)
        self.np_feed_index = self.feed_index.numpy()
        self._copied: torch.cuda.Event | None = None
        self._host = [self.input_ids, self.positions, self.slot_mapping, self.seq_lens, self.query_start_loc]
        if device.type == "cpu":
            self._device = self._host
            self.block_table_device = self.block_table
            self.feed_index_device = self.feed_index
        else:
            self._device = [torch.zeros_like(t, device=device) for t in self._host]
            self.block_table_device = torch.zeros_like(self.block_table, device=device)
            self.feed_index_device = torch.zeros_like(self.feed_index, device=device)
        (self.input_ids_device, self.positions_device, self.slot_mapping_device, self.seq_lens_device,
         self.query_start_loc_device) = self._device  # fmt: skip
        # numpy views for fast host-side filling
        self.np_input_ids = self.input_ids.numpy()
        self.np_positions = self.positions.numpy()
        self.np_slot_mapping = self.slot_mapping.numpy()
        self.np_block_table = self.block_table.numpy()
        # Per row: the block-id list it was written from (the KV manager's live list, held so it stays unique)
        # and how many entries were written, so a decode step only writes blocks added since the last one.
        self._row_source: list[tuple[list[int], int] | None] = [None] * max_seqs

    def wait_for_copies(self) -> None:
        """Block until the last copy_to_device has read the host buffers, so they may be overwritten."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None

    def write_block_table_row(self, row: int, block_ids: list[int]) -> None:
        source = self._row_source[row]
        start = source[1] if source is not None and source[0] is block_ids else 0
        if start < len(block_ids):
            self.np_block_table[row, start : len(block_ids)] = block_ids[start:]
        self._row_source[row] = (block_ids, len(block_ids))

    def copy_to_device(self, num_tokens: int, num_seqs: int, num_fed: int = 0) -> None:
        if self.device.type == "cpu":
            return
        if num_fed:  # the whole (small) buffer: a column slice is not contiguous
            self.feed_index_device.copy_(self.feed_index, non_blocking=True)
        for host, dev, n in zip(self._host, self._device, (num_tokens, num_tokens, num_tokens, num_seqs, num_seqs + 1)):
            dev[:n].copy_(host[:n], non_blocking=True)
        self.block_table_device[:num_seqs].copy_(self.block_table[:num_seqs], non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()

    def feed_sampled(self, num_fed: int, sampled: torch.Tensor) -> None:
        """On the device: input_ids[dst] = sampled[src] for the first ``num_fed`` columns of feed_index (filled
        on the host before copy_to_device): tokens the previous step sampled that the host has not seen yet."""
        index = self.feed_index_device[:, :num_fed]
        self.input_ids_device.index_copy_(0, index[0], sampled.index_select(0, index[1]))

    def metadata(
        self, num_tokens: int, num_seqs: int, max_query_len: int, max_seq_len: int, qsl: list[int], seq_lens: list[int]
    ) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            query_start_loc=self.query_start_loc_device[: num_seqs + 1],
            seq_lens=self.seq_lens_device[:num_seqs],
            block_tables=self.block_table_device[:num_seqs],
            slot_mapping=self.slot_mapping_device[:num_tokens],
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
        )

    def fill_padding(self, start_token: int, end_token: int, start_seq: int, end_seq: int) -> None:
        """Make padded decode rows harmless: no KV write, a one-token context, their own query row."""
        self.np_input_ids[start_token:end_token] = 0
        self.np_positions[start_token:end_token] = 0
        self.np_slot_mapping[start_token:end_token] = -1
        self.seq_lens.numpy()[start_seq:end_seq] = 1
        self.query_start_loc.numpy()[start_seq + 1 : end_seq + 1] = np.arange(start_seq + 1, end_seq + 1)
