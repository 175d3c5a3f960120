"""Profile a whole offline workload on a GPU (not a test): one warm-up, then the workload's ``generate`` under
the torch profiler (CUDA kernels only), then its kernels grouped by kind with their share of the wall time.

    python benchmarks/profile_workload.py --workload W2 [--num-prompts N --input-len N --output-len N]
        [--max-num-batched-tokens N] [--max-model-len N] [--quantization fp8] [--kv-cache-dtype fp8] [--kernels 25]

The groups answer "where does the GPU time go, and how much of the wall is the GPU idle": attention (prefill
vs decode kernels), GEMMs, small fused kernels, sampling, copies.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from brisk import LLM, SamplingParams
from brisk.bench import datasets
from brisk.bench.configs import LLAMA31_8B_CONFIG

GROUPS = (
    ("attention: prefill/extend", ("_unified_attention",)),
    ("attention: decode", ("_decode_attention",)),
    ("attention: long prefill (cuDNN)", ("cudnn", "flash_fprop", "sdpa")),
    ("KV write", ("_write_kv_cache",)),
    ("FP8 input quantization", ("_quantize_rows",)),
    ("GEMM (cuBLAS / cutlass)", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "cublas")),
    ("norm / rotary / silu (Triton)", ("rms_norm", "_rotary", "silu")),
    ("sampling", ("gumbel", "argmax", "softmax", "exponential", "sort", "topk")),
    ("copies / index", ("copy", "index", "Memcpy", "Memset", "fill")),
)


def group_of(name: str) -> str:
    for group, keys in GROUPS:
        if any(k.lower() in name.lower() for k in keys):
            return group
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="W2", choices=["W1", "W2"])
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--input-len", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--quantization", default=None, help="e.g. fp8 (weights quantized while loading)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="e.g. fp8")
    parser.add_argument("--kernels", type=int, default=20, help="How many of the top kernels to list.")
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    with open(f"{folder}/config.json", "w") as f:
        json.dump(LLAMA31_8B_CONFIG, f)
    kwargs = {"max_num_batched_tokens": args.max_num_batched_tokens} if args.max_num_batched_tokens else {}
    llm = LLM(folder, load_format="dummy", max_model_len=args.max_model_len, quantization=args.quantization,
              kv_cache_dtype=args.kv_cache_dtype, **kwargs)  # fmt: skip
    workload = datasets.build_workload(args.workload, args.num_prompts, args.input_len, args.output_len)
    params = [
        SamplingParams(temperature=workload.temperature, max_tokens=n, ignore_eos=True, detokenize=False)
        for n in workload.output_lens
    ]
    # Warm-up on the first prompts with their first id changed: the same shapes, but nothing the prefix cache can
    # give the profiled run (a workload of 16 prompts or fewer would otherwise be served from it).
    warm_up = [[(prompt[0] + 1) % 10000, *prompt[1:]] for prompt in workload.prompts[:16]]
    llm.generate(warm_up, params[:16], use_tqdm=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        llm.generate(workload.prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    totals: dict[str, float] = defaultdict(float)
    kernels = []
    for event in prof.key_averages():
        device_us = event.self_device_time_total
        if device_us <= 0:
            continue
        totals[group_of(event.key)] += device_us
        kernels.append((device_us, event.count, event.key))
    busy = sum(totals.values()) / 1e6
    out_tokens = sum(workload.output_lens)
    print(
        f"{args.workload}: wall {wall:.2f} s ({out_tokens / wall:,.0f} output tok/s under the profiler), "
        f"GPU busy {busy:.2f} s ({busy / wall:.0%}), idle {wall - busy:.2f} s"
    )
    for group, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {group:32s} {us / 1e6:7.3f} s  {us / 1e6 / wall:6.1%} of wall")
    print(f"top {args.kernels} kernels (total s, calls, name):")
    for us, count, name in sorted(kernels, reverse=True)[: args.kernels]:
        print(f"  {us / 1e6:7.3f} {count:7d}  {name[:110]}")


if __name__ == "__main__":
    main()
