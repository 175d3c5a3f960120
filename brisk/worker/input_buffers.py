"""Persistent per-step input buffers: packed on the host, moved to the device in one copy, unpacked in one kernel.

The model and the CUDA graphs read fixed device buffers (input ids, positions, slot mapping, sequence lengths,
query start locations, block table); a graph replays with whatever they hold. The host packs a step's values
into one int32 staging array (pinned on GPUs, so the copy is asynchronous) laid out for that step:

    [input ids: T | positions: T | slots: T | seq_lens: S | query_start_loc: S + 1 | block table: S x W]

with T tokens, S sequences and W the widest row of block ids the step reads. An input id ``-1 - j`` stands for row
``j`` of the previous step's sampled ids, still on the device (async scheduling: the host has not seen it yet).
One copy and one unpack launch (``triton_step_inputs.py``) replace a copy per buffer plus the indexing kernels
that fed sampled tokens. A small step (a decode batch) skips the copy too: the unpack kernel reads the pinned
array in place, one round trip over the bus, where a copy-engine transfer between two kernels waited about 5 us
for the engine (the profile of a batch-1 step). With async scheduling the host packs step N+1 while step N's
read of the array may still be queued, so packing first waits for that read (an event that has almost always
fired by then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from brisk.layers.attention.backend import AttentionMetadata


class StepInputs(NamedTuple):
    """Views of the staging array, laid out for one step, that the host fills."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray


class DeviceInputs(NamedTuple):
    """The fixed device buffers a step's inputs are unpacked into."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    block_table: torch.Tensor


# Steps of at most this many packed entries (one unpack program's block) are read in place from pinned memory;
# larger ones, such as prefill chunks, are copied: the copy engine moves them faster than scattered bus reads.
ZERO_COPY_MAX_ENTRIES = 1024


class InputBuffers:
    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device: torch.device):
        capacity = 3 * max_tokens + 2 * max_seqs + 1 + max_seqs * max_blocks_per_seq
        self.packed = torch.zeros(capacity, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.packed_device = torch.zeros_like(self.packed, device=device) if device.type == "cuda" else None
        self._np_packed = self.packed.numpy()
        self.on_device = DeviceInputs(
            input_ids=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            slot_mapping=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            seq_lens=torch.zeros(max_seqs, dtype=torch.int32, device=device),
            query_start_loc=torch.zeros(max_seqs + 1, dtype=torch.int32, device=device),
            block_table=torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device),
        )
        # The host's block table, kept across steps. Per row: the block-id list it was written from (the KV
        # manager's live list, held so it stays unique) and how many entries were written, so a decode step
        # only writes the blocks added since the last one.
        self.np_block_table = np.zeros((max_seqs, max_blocks_per_seq), dtype=np.int32)
        self._row_source: list[tuple[list[int], int] | None] = [None] * max_seqs
        self._read: torch.cuda.Event | None = None  # the device's last read of the staging array
        self._step: StepInputs | None = None
        self._unpack = _unpack_kernel(device) or _unpack_reference

    def begin_step(self, num_tokens: int, num_seqs: int) -> StepInputs:
        """The staging views for a step of ``num_tokens`` tokens in ``num_seqs`` sequences (padding included),
        once the device has read the previous step's staging array."""
        if self._read is not None:
            self._read.synchronize()
            self._read = None
        p, t, s = self._np_packed, num_tokens, num_seqs
        self._step = StepInputs(
            p[:t], p[t : 2 * t], p[2 * t : 3 * t], p[3 * t : 3 * t + s], p[3 * t + s : 3 * t + 2 * s + 1]
        )
        return self._step

    def write_block_table_row(self, row: int, block_ids: list[int]) -> None:
        source = self._row_source[row]
        start = source[1] if source is not None and source[0] is block_ids else 0
        if start < len(block_ids):
            self.np_block_table[row, start : len(block_ids)] = block_ids[start:]
        self._row_source[row] = (block_ids, len(block_ids))

    def clear_block_table(self) -> None:
        """Zero the host block table and forget which lists its rows came from (the next write is whole)."""
        self.np_block_table[:] = 0
        self._row_source = [None] * len(self._row_source)

    def fill_padding(self, start_token: int, start_seq: int, query_len: int = 1) -> None:
        """Make the step's rows from ``start_seq`` (tokens from ``start_token``) harmless padding: ``query_len``
        tokens each that write no KV, in a context of just themselves."""
        step = self._step
        num_pad = len(step.seq_lens) - start_seq
        assert len(step.input_ids) - start_token == num_pad * query_len, "each padding row holds query_len tokens"
        step.input_ids[start_token:] = 0
        step.positions[start_token:] = 0
        step.slot_mapping[start_token:] = -1
        step.seq_lens[start_seq:] = query_len
        end = start_token + num_pad * query_len
        step.query_start_loc[start_seq:] = np.arange(start_token, end + 1, query_len)

    def upload(self, block_width: int, sampled: torch.Tensor | None) -> None:
        """Move the step into the device buffers: the staging views, then the first ``block_width`` block ids
        of each row; ``sampled``: the previous step's sampled ids when an input id refers to them."""
        num_tokens, num_seqs = len(self._step.input_ids), len(self._step.seq_lens)
        base = 3 * num_tokens + 2 * num_seqs + 1
        end = base + num_seqs * block_width
        self._np_packed[base:end].reshape(num_seqs, block_width)[:] = self.np_block_table[:num_seqs, :block_width]
        packed = self.packed[:end]
        if self.packed_device is not None and end > ZERO_COPY_MAX_ENTRIES:
            packed = self.packed_device[:end]
            packed.copy_(self.packed[:end], non_blocking=True)
        self._unpack(packed, sampled, self.on_device, num_tokens, num_seqs, block_width)
        if self.packed_device is not None:
            self._read = torch.cuda.Event()
            self._read.record()

    def metadata(
        self,
        num_tokens: int,
        num_seqs: int,
        max_query_len: int,
        max_seq_len: int,
        qsl: list[int],
        seq_lens: list[int],
        for_graph: bool = False,
    ) -> AttentionMetadata:
        return AttentionMetadata(
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            query_start_loc=self.on_device.query_start_loc[: num_seqs + 1],
            seq_lens=self.on_device.seq_lens[:num_seqs],
            block_tables=self.on_device.block_table[:num_seqs],
            slot_mapping=self.on_device.slot_mapping[:num_tokens],
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
            for_graph=for_graph,
        )


def _unpack_kernel(device: torch.device) -> Callable | None:
    """The Triton unpack launcher on a GPU with Triton installed."""
    if device.type != "cuda":
        return None
    try:
        from brisk.worker.triton_step_inputs import unpack_step_inputs
    except ImportError:
        return None
    return unpack_step_inputs


def _unpack_reference(
    packed: torch.Tensor, sampled: torch.Tensor | None, out: DeviceInputs, num_tokens: int, num_seqs: int, width: int
) -> None:
    """``triton_step_inputs.unpack_step_inputs`` in torch: the CPU path, and the kernel's reference in tests."""
    t, s = num_tokens, num_seqs
    ids = packed[:t].long()
    if sampled is not None:
        fed = ids < 0
        ids[fed] = sampled[-1 - ids[fed]].to(ids.device)
    out.input_ids[:t] = ids
    out.positions[:t] = packed[t : 2 * t]
    out.slot_mapping[:t] = packed[2 * t : 3 * t]
    out.seq_lens[:s] = packed[3 * t : 3 * t + s]
    out.query_start_loc[: s + 1] = packed[3 * t + s : 3 * t + 2 * s + 1]
    out.block_table[:s, :width] = packed[3 * t + 2 * s + 1 :].view(s, width)
