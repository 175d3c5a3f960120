"""The GPU half of ``InputBuffers.upload``: one kernel spreads a step's packed inputs into the persistent buffers.

A step's inputs arrive as one int32 array (``InputBuffers`` documents the layout); copying it in one transfer
and unpacking it in one launch replaces a copy per buffer plus the two indexing kernels that fed the previous
step's sampled tokens, each a few microseconds of the gap between two batch-1 decode steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brisk.layers.pdl import allow_next_kernel, pdl_launch_options, wait_for_previous_kernel
from brisk.worker.input_buffers import ZERO_COPY_MAX_ENTRIES, DeviceInputs

UNPACK_BLOCK = ZERO_COPY_MAX_ENTRIES  # a step read in place from host memory is one program's block


# Two compiled variants, one-token steps (launched with PDL) and the rest: sizes are not specialized (a step of one
# sequence, or of a multiple of 16 tokens, would otherwise compile its own), and a step without fed tokens has
# none to load.
@triton.jit(do_not_specialize=["num_tokens", "num_seqs", "block_width", "block_table_stride"])
def _unpack_step_inputs_kernel(
    packed_ptr, sampled_ptr, input_ids_ptr, positions_ptr, slot_mapping_ptr, seq_lens_ptr, query_start_loc_ptr,
    block_table_ptr, num_tokens, num_seqs, block_width, block_table_stride, BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):  # fmt: skip
    """Program p unpacks element block p of every section; an input id ``-1 - j`` is row j of ``sampled``.

    The packed values come from the host, not from the previous kernel, so they are loaded before the PDL wait
    (for a step read in place, the bus round trip overlaps the sampling kernels); the fed ids and every store
    come after it."""
    allow_next_kernel(USE_PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tok = offs < num_tokens
    ids = tl.load(packed_ptr + offs, mask=tok, other=0).to(tl.int64)
    positions = tl.load(packed_ptr + num_tokens + offs, mask=tok).to(tl.int64)
    slots = tl.load(packed_ptr + 2 * num_tokens + offs, mask=tok).to(tl.int64)
    seq_base = 3 * num_tokens
    seq = offs < num_seqs
    seq_lens = tl.load(packed_ptr + seq_base + offs, mask=seq)
    loc = offs <= num_seqs
    query_start_loc = tl.load(packed_ptr + seq_base + num_seqs + offs, mask=loc)
    table = offs < num_seqs * block_width
    entry = tl.load(packed_ptr + seq_base + 2 * num_seqs + 1 + offs, mask=table)
    wait_for_previous_kernel(USE_PDL)

    fed = tok & (ids < 0)
    ids = tl.where(fed, tl.load(sampled_ptr + (-1 - ids), mask=fed, other=0), ids)
    tl.store(input_ids_ptr + offs, ids, mask=tok)
    tl.store(positions_ptr + offs, positions, mask=tok)
    tl.store(slot_mapping_ptr + offs, slots, mask=tok)
    tl.store(seq_lens_ptr + offs, seq_lens, mask=seq)
    tl.store(query_start_loc_ptr + offs, query_start_loc, mask=loc)
    row, col = offs // block_width, offs % block_width
    tl.store(block_table_ptr + row.to(tl.int64) * block_table_stride + col, entry, mask=table)


def unpack_step_inputs(
    packed: torch.Tensor, sampled: torch.Tensor | None, out: DeviceInputs, num_tokens: int, num_seqs: int, width: int
) -> None:
    """Write ``packed`` (on the device, or pinned host memory that the kernel reads in place) into ``out``, as
    ``InputBuffers`` lays it out; ``sampled``: the previous step's sampled ids when some input ids refer to them."""
    assert out.block_table.stride(1) == 1
    largest = max(num_tokens, num_seqs + 1, num_seqs * width)
    _unpack_step_inputs_kernel[(triton.cdiv(largest, UNPACK_BLOCK),)](
        packed, sampled if sampled is not None else out.input_ids, *out, num_tokens, num_seqs, width,
        out.block_table.stride(0), BLOCK=UNPACK_BLOCK, **pdl_launch_options(out.input_ids.device, num_tokens),
    )  # fmt: skip
