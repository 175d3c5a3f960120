"""Sweep the unified (prefill) attention kernel's launch parameters on a GPU (not a test) for long prompt chunks of
the Llama-3.1-8B shape (32 query heads, 8 KV heads, head size 128, 16-token pages, bf16), and time torch's own
SDPA backends (FlashAttention 2, cuDNN, memory-efficient) on the same attention over contiguous keys and values:
what a library kernel would give (W4's 32k prefill spends most of its attention time here).

    python benchmarks/tune_prefill_attention.py [--shapes 0+16384,16384+15616] [--top 8]

A shape ``C+Q`` is one sequence whose ``Q`` new tokens attend causally to ``C`` cached ones and to each other.
TFLOP/s counts the causal work: 4 x head size x heads x (Q x C + Q (Q + 1) / 2). The first line of each shape is
the default heuristic.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton

from brisk.layers.attention import triton_kernels as tk

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 32, 8, 128, 16


def make_chunk(context: int, query_len: int):
    """Queries of one chunk and a paged cache that holds its context and itself, pages scattered."""
    seq_len = context + query_len
    pages = triton.cdiv(seq_len, BLOCK)
    kv_cache = torch.randn(2, pages + 1, BLOCK, KV_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device="cuda")
    block_table = torch.randperm(pages, device="cuda").to(torch.int32)[None, :]
    query = torch.randn(query_len, HEADS, HEAD_SIZE, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device="cuda")
    query_start_loc = torch.tensor([0, query_len], dtype=torch.int32, device="cuda")
    return query, kv_cache, block_table, seq_lens, query_start_loc


def contiguous_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence's keys and values gathered from its pages: [1, kv heads, seq_len, head size] each."""
    pages = kv_cache[:, block_table[0].long()].flatten(1, 2)[:, :seq_len]  # [2, seq_len, kv heads, head]
    return pages[0].transpose(0, 1)[None].contiguous(), pages[1].transpose(0, 1)[None].contiguous()


def sdpa_runs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, context: int) -> dict:
    """torch SDPA per backend over the same causal attention (bottom-right aligned when there is a context)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    q = query.transpose(0, 1)[None]  # [1, heads, Q, head]
    mask = causal_lower_right(q.shape[2], key.shape[2]) if context else None
    runs = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):

        def run(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, key, value, attn_mask=mask, is_causal=mask is None, enable_gqa=True
                )

        runs[backend.name] = run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="0+16384,16384+15616")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        context, query_len = (int(x) for x in shape.split("+"))
        query, kv_cache, block_table, seq_lens, query_start_loc = make_chunk(context, query_len)
        output = torch.empty_like(query)
        tflop = 4 * HEAD_SIZE * HEADS * (query_len * context + query_len * (query_len + 1) / 2) / 1e12
        run = functools.partial(
            tk.unified_attention, query, kv_cache, output, block_table, seq_lens, query_start_loc,
            HEAD_SIZE**-0.5, 1, query_len,
        )  # fmt: skip
        reference = run().clone()
        configs = [{}] + [
            dict(block_m=m, tile_n=n, num_warps=w, num_stages=s)
            for m, n, w, s in itertools.product((64, 128), (64, 128), (4, 8), (2, 3, 4))
        ]
        results = []
        for kw in configs:
            try:
                ms = triton.testing.do_bench(functools.partial(run, **kw), warmup=10, rep=100)
            except Exception as exc:  # a config the compiler rejects (shared memory, registers): skip it
                print(f"  skip {kw}: {type(exc).__name__}")
                continue
            results.append((ms, kw))
        print(f"context {context} + query {query_len} ({tflop:.2f} TFLOP):")
        print(f"  default   {results[0][0]:8.2f} ms  {tflop / results[0][0] * 1e3:6.1f} TFLOP/s")
        for ms, kw in sorted(results[1:], key=lambda r: r[0])[: args.top]:
            print(f"  {ms:8.2f} ms  {tflop / ms * 1e3:6.1f} TFLOP/s  {kw}")
        key, value = contiguous_kv(kv_cache, block_table, context + query_len)
        for name, sdpa in sdpa_runs(query, key, value, context).items():
            try:
                got = sdpa()[0].transpose(0, 1)
                ms = triton.testing.do_bench(sdpa, warmup=10, rep=100)
            except Exception as exc:  # a backend that does not take this shape or mask
                print(f"  torch SDPA {name}: unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                continue
            err = (got.float() - reference.float()).abs().max().item()
            print(f"  torch SDPA {name}: {ms:8.2f} ms  {tflop / ms * 1e3:6.1f} TFLOP/s  (max |diff| {err:.3g})")
        gather = functools.partial(contiguous_kv, kv_cache, block_table, context + query_len)
        gather_ms = triton.testing.do_bench(gather)
        print(f"  gathering the pages into contiguous K and V: {gather_ms:.2f} ms")


if __name__ == "__main__":
    main()
