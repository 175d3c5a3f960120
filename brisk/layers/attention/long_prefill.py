"""Long prompt chunks through a library's fused attention kernel (cuDNN's, through torch) instead of Triton's.

At 16,384-token chunks on an H200, cuDNN's fused attention ran 573 TFLOP/s on a causal prompt against 413 for
brisk's unified Triton kernel at its best launch configuration (``benchmarks/tune_prefill_attention.py``), and
long prompts spend most of their prefill in attention (W4: 32,000-token prompts). cuDNN takes contiguous keys and
values and has no offset causal mask, so a chunk that follows ``C`` cached tokens is split in two:

* the chunk over its context (keys ``0 .. C``): every key visible to every query, no mask;
* the chunk over itself (keys ``C .. C + Q``): plain causal, top-left aligned;

each with its log-sum-exp, merged exactly: ``out = lerp(out_self, out_context, sigmoid(lse_context - lse_self))``
(the softmax weight of the context's share). The sequence's pages are gathered into contiguous keys and values
first (one ``index_select``: about 0.3 ms at 32,000 tokens, against 15 ms of attention).

Each sequence of a step with a chunk of at least ``LONG_CHUNK_TOKENS`` takes this path (one Python call per such
sequence); the step's other sequences (short chunks, decodes) stay on the unified kernel, which skips the long ones.
Never in a CUDA graph's step (``AttentionMetadata.for_graph``): the loop and its slices are decided on the host.
On the CPU the same split runs through torch's flash kernel for the CPU, which is what the tests check the merge
with.
"""

from __future__ import annotations

import functools

import torch

from brisk.layers.attention.backend import AttentionMetadata, gather_pages
from brisk.layers.quantization.kv_cache import dequantize_kv, is_fp8

LONG_CHUNK_TOKENS = 2048  # the shortest chunk worth a library call; W3's and W5's prompts stay on Triton


@functools.cache
def _cudnn_attention_enabled() -> bool:
    return torch.backends.cudnn.is_available() and torch.backends.cuda.cudnn_sdp_enabled()


def long_chunk_seqs(query: torch.Tensor, metadata: AttentionMetadata) -> list[int]:
    """The step's sequences that take the library path: on a CUDA half-precision step (cuDNN's kernel takes head
    sizes up to 128 here) that is not a CUDA graph's, those with at least ``LONG_CHUNK_TOKENS`` new tokens."""
    if not query.is_cuda or query.dtype not in (torch.float16, torch.bfloat16) or query.shape[-1] > 128:
        return []
    if metadata.max_query_len < LONG_CHUNK_TOKENS or not _cudnn_attention_enabled():
        return []
    if metadata.for_graph:
        return []
    starts = metadata.query_start_loc_cpu
    return [i for i in range(metadata.num_seqs) if starts[i + 1] - starts[i] >= LONG_CHUNK_TOKENS]


def _attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused attention of ``q`` [1, heads, Q, D] over ``k``/``v`` [1, kv heads, S, D] (grouped heads taken as
    they are), with each row's natural-log log-sum-exp [1, heads, Q] (float32)."""
    if q.is_cuda:
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
        return out[0], out[1].reshape(q.shape[:3])
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def long_prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    metadata: AttentionMetadata,
    seqs: list[int],
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of sequences ``seqs``' chunks over their pages (the cache already holds the chunks' keys and
    values), written into their rows of ``output`` [num_tokens, heads, D]; an FP8 cache is dequantized while
    gathering."""
    block_size = kv_cache.shape[2]
    starts = metadata.query_start_loc_cpu
    for i in seqs:
        seq_len, q_start, q_end = metadata.seq_lens_cpu[i], starts[i], starts[i + 1]
        context = seq_len - (q_end - q_start)
        blocks = metadata.block_tables[i, : -(-seq_len // block_size)].long()
        pages = gather_pages(kv_cache, blocks).flatten(1, 2)[:, :seq_len]  # [2, seq_len, kv heads, D]
        if is_fp8(kv_cache):
            pages = torch.stack([dequantize_kv(kv, s, query.dtype) for kv, s in zip(pages, (k_scale, v_scale))])
        keys, values = pages.to(query.dtype).transpose(1, 2).unsqueeze(1)  # each [1, kv heads, seq_len, D]
        q = query[q_start:q_end].transpose(0, 1).unsqueeze(0)  # [1, heads, Q, D]
        out, lse = _attention_with_lse(q, keys[:, :, context:], values[:, :, context:], scale, causal=True)
        if context:
            out_ctx, lse_ctx = _attention_with_lse(q, keys[:, :, :context], values[:, :, :context], scale, False)
            weight = torch.sigmoid(lse_ctx - lse).unsqueeze(-1)  # the context's share of each row's softmax
            out = torch.lerp(out.float(), out_ctx.float(), weight)
        output[q_start:q_end] = out[0].transpose(0, 1).to(output.dtype)
    return output
