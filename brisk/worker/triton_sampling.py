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


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr, temperature_ptr, out_ptr, row_stride, vocab, seed, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0)
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature == 0.0
    inv_t = 1.0 / tl.where(greedy, 1.0, temperature)
    best_val = tl.full((), float("-inf"), tl.float32)
    best_idx = tl.full((), 0, tl.int32)
    for start in range(0, vocab, BLOCK):
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
    tl.store(out_ptr + row, best_idx.to(tl.int64))


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor, seed: int) -> torch.Tensor:
    """Per row: argmax when its temperature is 0, else a sample from softmax(logits / temperature)."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows:
        block = min(4096, triton.next_power_of_2(vocab))
        _gumbel_argmax_kernel[(rows,)](
            logits, temperature, out, logits.stride(0), vocab, seed, BLOCK=block, num_warps=8
        )
    return out
