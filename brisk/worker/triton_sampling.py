"""One-pass sampling on the GPU: greedy argmax or Gumbel-max over the logits, without materializing probabilities.

``argmax(logits / T + Gumbel noise)`` draws from ``softmax(logits / T)`` exactly like the exponential race the
torch sampler uses, but reads each row of logits once (bf16, as the LM head wrote them) instead of the half a
dozen float32 passes of softmax, noise, division and argmax. Used for rows without top-k / top-p / min-p and
without a per-request seed; the torch sampler stays the reference and handles everything else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from brisk.layers.device_limits import num_sms
from brisk.layers.pdl import pdl_launch_options, start_dependent_kernel


@triton.jit(do_not_specialize=["seed", "split_len"])
def _gumbel_argmax_kernel(
    logits_ptr, temperature_ptr, part_val_ptr, part_idx_ptr, row_stride, vocab, seed, split_len,
    BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    """Program (row, split) finds the best of the ``split_len`` columns of its split: the candidate it stores for
    ``_pick_split_kernel``."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    temperature = tl.load(temperature_ptr + row)  # host memory read in place: its bus round trip overlaps the wait
    start_dependent_kernel(USE_PDL)
    greedy = temperature == 0.0
    inv_t = 1.0 / tl.where(greedy, 1.0, temperature)
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int32)
    first = split * split_len
    for start in range(first, tl.minimum(first + split_len, vocab), BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        x = tl.load(logits_ptr + row * row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
        if not greedy:
            u = tl.rand(seed, row * vocab + cols)
            u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
            x = x * inv_t - tl.log(-tl.log(u))
        x = tl.where(mask, x, float("-inf"))
        block_max = tl.max(x, axis=0)
        block_idx = tl.argmax(x, axis=0).to(tl.int32) + start
        take = block_max > best_val  # strict: the earliest index wins ties, as torch.argmax does
        best_idx = tl.where(take, block_idx, best_idx)
        best_val = tl.where(take, block_max, best_val)
    tl.store(part_val_ptr + row * tl.num_programs(1) + split, best_val)
    tl.store(part_idx_ptr + row * tl.num_programs(1) + split, best_idx)


@triton.jit(do_not_specialize=["splits"])
def _pick_split_kernel(
    part_val_ptr, part_idx_ptr, out_ptr, host_out_ptr, splits, SPLITS_P2: tl.constexpr, USE_PDL: tl.constexpr
):  # fmt: skip
    """The best of a row's split candidates; the leftmost wins ties, so the earliest column does overall. It is
    stored twice: on the device for the next step, and in host memory for the host to read."""
    start_dependent_kernel(USE_PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, SPLITS_P2)
    vals = tl.load(part_val_ptr + row * splits + offs, mask=offs < splits, other=float("-inf"))
    best = tl.argmax(vals, axis=0, tie_break_left=True)
    token = tl.load(part_idx_ptr + row * splits + best).to(tl.int64)
    tl.store(out_ptr + row, token)
    tl.store(host_out_ptr + row, token)


SAMPLING_BLOCK = 4096


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: argmax when its temperature is 0, else a sample from softmax(logits / temperature). Returns the
    ids on the device and in host memory (pinned on a GPU), both written by the kernel: reading them back takes
    no copy, whose transfer waited about 5 us for the copy engine after each batch-1 step. ``temperature`` is
    read before the PDL wait, so it must not be written by the kernel before: pinned host memory (read in place)
    or a tensor that is ready when the launch is made.

    A few rows split their vocabulary across programs (one block of columns each at batch 1), so that a
    128k-entry row is read by the whole GPU rather than by one SM; a second launch picks each row's best split.
    Every batch size uses the same two compiled kernels (the split count is a runtime value), so none is
    compiled in the middle of a run.
    """
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    host_out = torch.empty(rows, dtype=torch.int64, pin_memory=logits.is_cuda)
    if not rows:
        return out, host_out
    block = min(SAMPLING_BLOCK, triton.next_power_of_2(vocab))
    blocks = triton.cdiv(vocab, block)
    splits = max(1, min(blocks, triton.cdiv(num_sms(logits.device), rows)))
    split_len = triton.cdiv(blocks, splits) * block
    splits = triton.cdiv(vocab, split_len)
    part_val = torch.empty(rows, splits, dtype=torch.float32, device=logits.device)
    part_idx = torch.empty(rows, splits, dtype=torch.int32, device=logits.device)
    pdl = pdl_launch_options(logits.device, rows)
    _gumbel_argmax_kernel[(rows, splits)](
        logits, temperature, part_val, part_idx, logits.stride(0), vocab, seed, split_len, BLOCK=block, num_warps=8,
        **pdl,
    )  # fmt: skip
    _pick_split_kernel[(rows,)](
        part_val, part_idx, out, host_out, splits, SPLITS_P2=triton.next_power_of_2(blocks), num_warps=1, **pdl
    )
    return out, host_out
