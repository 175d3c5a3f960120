"""A step's packed inputs land in the persistent buffers: the Triton unpack kernel (its interpreter on CPU) against
the torch reference, and InputBuffers' layout, padding and fed tokens end to end."""

import numpy as np
import pytest
import torch

from brisk.worker.input_buffers import DeviceInputs, InputBuffers, _unpack_reference

triton_step_inputs = pytest.importorskip("brisk.worker.triton_step_inputs")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_TOKENS, MAX_SEQS, MAX_BLOCKS = 2100, 40, 64


def _buffers(fill: int) -> DeviceInputs:
    """Output buffers holding ``fill`` everywhere, so that what a step leaves alone is visible."""
    shapes = [(MAX_TOKENS, torch.int64)] * 3 + [(MAX_SEQS, torch.int32), (MAX_SEQS + 1, torch.int32)]
    out = [torch.full((n,), fill, dtype=dtype, device=DEVICE) for n, dtype in shapes]
    return DeviceInputs(*out, torch.full((MAX_SEQS, MAX_BLOCKS), fill, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("num_tokens,num_seqs,width,with_sampled", [(2050, 3, 5, True), (37, 37, 40, False)])
def test_unpack_kernel_matches_reference(num_tokens, num_seqs, width, with_sampled):
    """More tokens than one program's block (2050) and a block table larger than the tokens (37 x 40): every
    section is written up to its own length and nothing past it; negative ids take the sampled rows."""
    gen = torch.Generator().manual_seed(num_tokens)
    packed = torch.randint(0, 50_000, (3 * num_tokens + 2 * num_seqs + 1 + num_seqs * width,), generator=gen)
    packed = packed.to(torch.int32)
    sampled = torch.randint(0, 50_000, (7,), generator=gen) if with_sampled else None
    if with_sampled:
        packed[[0, 5, num_tokens - 1]] = torch.tensor([-1, -7, -3], dtype=torch.int32)
    expected, actual = _buffers(-5), _buffers(-5)
    _unpack_reference(packed, sampled, expected, num_tokens, num_seqs, width)
    triton_step_inputs.unpack_step_inputs(
        packed.to(DEVICE), sampled.to(DEVICE) if with_sampled else None, actual, num_tokens, num_seqs, width
    )
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e)
    if with_sampled:
        assert expected.input_ids[[0, 5, num_tokens - 1]].tolist() == [sampled[0], sampled[6], sampled[2]]
    assert (expected.block_table[:num_seqs, width:] == -5).all() and (expected.input_ids[num_tokens:] == -5).all()


def test_input_buffers_pack_pad_and_feed():
    """Two real rows (a 3-token chunk, and a decode whose input is row 1 of the previous step's samples), then two
    padding rows: the device buffers hold exactly that, and the next step's upload only what it packed."""
    buffers = InputBuffers(MAX_TOKENS, MAX_SEQS, MAX_BLOCKS, torch.device(DEVICE))
    buffers.write_block_table_row(0, [7, 8])
    buffers.write_block_table_row(1, [3])
    step = buffers.begin_step(6, 4)
    step.input_ids[:4] = [11, 12, 13, -2]
    step.positions[:4] = [16, 17, 18, 4]
    step.slot_mapping[:4] = [128, 129, 130, 52]
    step.seq_lens[:2] = [19, 5]
    step.query_start_loc[:3] = [0, 3, 4]
    buffers.fill_padding(4, 2)
    sampled = torch.tensor([900, 901, 902], device=DEVICE)
    buffers.upload(block_width=2, sampled=sampled)
    md = buffers.metadata(6, 4, 3, 19, [0, 3, 4, 5, 6], [19, 5, 1, 1])
    assert buffers.on_device.input_ids[:6].tolist() == [11, 12, 13, 901, 0, 0]
    assert buffers.on_device.positions[:6].tolist() == [16, 17, 18, 4, 0, 0]
    assert md.slot_mapping.tolist() == [128, 129, 130, 52, -1, -1]
    assert md.seq_lens.tolist() == [19, 5, 1, 1]
    assert md.query_start_loc.tolist() == [0, 3, 4, 5, 6]
    assert md.block_tables[:2, :2].tolist() == [[7, 8], [3, 0]]
    # The next step reuses the staging array; its rows grow by one block and nothing is fed.
    buffers.write_block_table_row(0, [7, 8, 9])
    step = buffers.begin_step(1, 1)
    step.input_ids[0], step.positions[0], step.slot_mapping[0] = 5, 32, 144
    step.seq_lens[0], step.query_start_loc[:2] = 33, [0, 1]
    buffers.upload(block_width=3, sampled=None)
    assert buffers.on_device.input_ids[0].item() == 5
    assert buffers.on_device.block_table[0, :3].tolist() == [7, 8, 9]
    assert np.array_equal(buffers.np_block_table[1, :1], [3])
    # An all-padding step (as graph capture packs one) over a staging array that earlier steps left full; then
    # row 0's list grows again after the table was cleared: its whole list is written, not only the new block.
    buffers.clear_block_table()
    buffers.begin_step(4, 4)
    buffers.fill_padding(0, 0)
    buffers.upload(block_width=1, sampled=None)
    assert buffers.on_device.query_start_loc[:5].tolist() == [0, 1, 2, 3, 4]
    assert buffers.on_device.slot_mapping[:4].tolist() == [-1] * 4
    assert buffers.on_device.seq_lens[:4].tolist() == [1] * 4
    table = [7, 8, 9]
    buffers.write_block_table_row(0, table)
    table.append(10)
    buffers.clear_block_table()
    buffers.write_block_table_row(0, table)
    assert buffers.np_block_table[0, :4].tolist() == [7, 8, 9, 10]


def test_large_steps_are_copied_and_small_ones_read_in_place():
    """On a GPU a step of more than ZERO_COPY_MAX_ENTRIES packed entries goes through the device copy and a smaller
    one is read from pinned memory by the kernel; each lands whole, and the small step packed right after the large
    one does not disturb what the large one's copy moved."""
    from brisk.worker.input_buffers import ZERO_COPY_MAX_ENTRIES

    buffers = InputBuffers(MAX_TOKENS, MAX_SEQS, MAX_BLOCKS, torch.device(DEVICE))
    num_tokens = ZERO_COPY_MAX_ENTRIES // 3 + 1
    buffers.write_block_table_row(0, list(range(1, 1 + -(-num_tokens // 16))))
    step = buffers.begin_step(num_tokens, 1)
    step.input_ids[:] = np.arange(num_tokens) + 1000
    step.positions[:] = np.arange(num_tokens)
    step.slot_mapping[:] = np.arange(num_tokens) + 16
    step.seq_lens[0], step.query_start_loc[:2] = num_tokens, [0, num_tokens]
    buffers.upload(block_width=-(-num_tokens // 16), sampled=None)
    large_ids = buffers.on_device.input_ids[:num_tokens].clone()
    step = buffers.begin_step(1, 1)
    step.input_ids[0], step.positions[0], step.slot_mapping[0] = -1, num_tokens, num_tokens + 16
    step.seq_lens[0], step.query_start_loc[:2] = num_tokens + 1, [0, 1]
    buffers.upload(block_width=-(-(num_tokens + 1) // 16), sampled=torch.tensor([77], device=DEVICE))
    assert large_ids.tolist() == list(range(1000, 1000 + num_tokens))
    assert buffers.on_device.input_ids[0].item() == 77
    assert buffers.on_device.positions[0].item() == num_tokens
    assert buffers.on_device.slot_mapping[:2].tolist() == [num_tokens + 16, 17]
    assert buffers.on_device.seq_lens[0].item() == num_tokens + 1
