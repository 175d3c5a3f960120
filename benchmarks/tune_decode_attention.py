"""Sweep the split-KV decode kernel's launch parameters on a GPU (not a test) for the Llama-3.1-8B shape (32 query
heads, 8 KV heads, head size 128, 16-token pages, bf16; with the rotary embedding and the cache write the kernel
does in a model) and print each config's time and KV bandwidth.

    python benchmarks/tune_decode_attention.py [--shapes 256x820,1x300] [--splits 5,4,2] [--kv-cache-dtype fp8]
        [--grid small]

Bandwidth counts the K and V bytes the batch must read once (batch x context x 8 heads x 128 x 2 x 2 bytes, one
byte instead of two for an FP8 cache);
the H200's measured copy ceiling is about 4.3 TB/s. The first line of each shape is the default heuristic.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton

from brisk.layers.attention import triton_kernels as tk
from brisk.layers.attention.backend import AttentionMetadata
from brisk.layers.rotary import RotaryEmbedding

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 32, 8, 128, 16


def make_batch(batch: int, context: int, max_model_len: int, cache_dtype: torch.dtype = torch.bfloat16):
    blocks_per_seq = triton.cdiv(max_model_len, BLOCK)
    num_blocks = batch * triton.cdiv(context, BLOCK) + 1
    kv_cache = torch.randn(2, num_blocks, BLOCK, KV_HEADS, HEAD_SIZE, device="cuda").to(cache_dtype)
    order = torch.randperm(num_blocks - 1, device="cuda").to(torch.int32)  # pages scattered as in a real cache
    used = triton.cdiv(context, BLOCK)
    block_tables = torch.zeros(batch, blocks_per_seq, dtype=torch.int32, device="cuda")
    block_tables[:, :used] = order[: batch * used].view(batch, used)
    query, key, value = (torch.randn(batch, h, HEAD_SIZE, dtype=torch.bfloat16, device="cuda")
                         for h in (HEADS, KV_HEADS, KV_HEADS))  # fmt: skip
    last = torch.full((batch,), context - 1, device="cuda")
    slot_mapping = block_tables.gather(1, (last // BLOCK)[:, None].to(torch.int64))[:, 0].long() * BLOCK + last % BLOCK
    metadata = AttentionMetadata(
        num_tokens=batch,
        num_seqs=batch,
        max_query_len=1,
        max_seq_len=max_model_len,  # the bound CUDA graphs are captured with
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((batch,), context, dtype=torch.int32, device="cuda"),
        block_tables=block_tables,
        slot_mapping=slot_mapping,
        query_start_loc_cpu=list(range(batch + 1)),
        seq_lens_cpu=[context] * batch,
    )
    rope = RotaryEmbedding(HEAD_SIZE, max_model_len, {"rope_type": "default", "rope_theta": 500000.0}).to("cuda")
    return query, key, value, kv_cache, metadata, (rope.cos, rope.sin, last)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="256x820,64x1800,1x300,1x2000")
    parser.add_argument("--max-model-len", type=int, default=4096, help="The bound graphs are captured with.")
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--splits", default=None, help="only these split counts (e.g. 5,4,2) at the default launch")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    parser.add_argument(
        "--grid", default="full", choices=["full", "small"],
        help="small: tiles, warps and stages at the default split count and partition (24 compiles, not 216)",
    )  # fmt: skip
    args = parser.parse_args()
    cache_dtype = torch.float8_e4m3fn if args.kv_cache_dtype == "fp8" else torch.bfloat16
    for shape in args.shapes.split(","):
        batch, context = (int(x) for x in shape.split("x"))
        query, key, value, kv_cache, metadata, rotary = make_batch(batch, context, args.max_model_len, cache_dtype)
        output = torch.empty_like(query)
        gbytes = batch * context * KV_HEADS * HEAD_SIZE * 2 * kv_cache.element_size() / 1e9
        run = functools.partial(tk.decode_attention, query, key, value, kv_cache, output, metadata, 0.088, rotary)

        default_splits = tk.decode_num_splits(batch, KV_HEADS, args.max_model_len, query.device)
        configs = [{}]
        if args.splits:  # a quick look at the split count alone: one compile per count, not the 216 of the sweep
            configs += [dict(num_splits=int(n)) for n in args.splits.split(",")]
        elif args.grid == "small":
            # One stage: no asynchronous copies into shared memory, so an FP8 tile is widened in registers first.
            for tile, warps, stages in itertools.product((64, 128, 256), (4, 8), (1, 2, 3, 4)):
                configs.append(dict(tile_n=tile, num_warps=warps, num_stages=stages))
        else:
            for splits, tile, warps, stages, part in itertools.product(
                sorted({1, 2, 4, default_splits}), (32, 64, 128), (4, 8), (2, 3, 4), (128, 256, 512)
            ):
                configs.append(
                    dict(num_splits=splits, tile_n=tile, num_warps=warps, num_stages=stages, min_partition=part)
                )
        results = []
        for kw in configs:
            try:
                ms = triton.testing.do_bench(functools.partial(run, **kw), warmup=10, rep=40)
            except Exception as exc:  # a config the compiler rejects (shared memory): skip it
                print(f"  skip {kw}: {type(exc).__name__}")
                continue
            results.append((ms, kw))
        default_ms = results[0][0]
        print(f"batch {batch} x context {context} ({gbytes * 1e3:.1f} MB of {args.kv_cache_dtype} KV), "
              f"default splits {default_splits}:")  # fmt: skip
        print(f"  default   {default_ms * 1e3:8.1f} us  {gbytes / default_ms:6.2f} TB/s")
        for ms, kw in sorted(results[1:], key=lambda r: r[0])[: args.top]:
            print(f"  {ms * 1e3:8.1f} us  {gbytes / ms:6.2f} TB/s  {kw}")


if __name__ == "__main__":
    main()
