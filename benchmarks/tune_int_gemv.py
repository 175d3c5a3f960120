"""Batch-1 GEMV tiles for packed INT4/INT8 weights (``triton_int_gemm.GEMV_CONFIG``) and the FP8-weight GEMV, on
the Llama-3.1-8B projections: time per projection and the bandwidth it reaches, beside the bf16 GEMV.

    python benchmarks/tune_int_gemv.py [--bits 4] [--group 128]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk.layers import triton_gemv  # noqa: E402
from brisk.layers.quantization import triton_int_gemm  # noqa: E402
from brisk.layers.quantization.fp8_utils import quantize_fp8_per_row  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
CANDIDATES = [(4, 1024, 4), (8, 512, 4), (8, 1024, 4), (8, 1024, 8), (16, 1024, 8), (8, 2048, 8)]


def median_ms(fn, *args) -> float:
    return do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev, per_word = "cuda", 32 // args.bits
    totals: dict = {}
    for name, (n, k) in SHAPES.items():
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // per_word), device=dev, dtype=torch.int32)
        scales = torch.rand(n, k // args.group, device=dev, dtype=torch.bfloat16) * 0.01
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        weight_bytes = packed.numel() * 4 + scales.numel() * 2
        row = [f"{name:8s} {n}x{k}"]
        for config in CANDIDATES:
            triton_int_gemm.GEMV_CONFIG = config
            ms = median_ms(triton_int_gemm.int_weight_gemm, x, packed, scales, None, args.bits, args.group)
            totals.setdefault(config, 0.0)
            totals[config] += ms
            row.append(f"{config}: {ms * 1e3:.1f} us {weight_bytes / ms / 1e6:.0f} GB/s")
        bf16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.01
        ms = median_ms(triton_gemv.gemv, x, bf16, None)
        row.append(f"bf16 gemv: {ms * 1e3:.1f} us {bf16.numel() * 2 / ms / 1e6:.0f} GB/s")
        fp8, scale = quantize_fp8_per_row(bf16)
        scale = scale.view(-1)
        ms = median_ms(triton_gemv.gemv, x, fp8, None, scale)
        row.append(f"fp8 gemv: {ms * 1e3:.1f} us {fp8.numel() / ms / 1e6:.0f} GB/s")
        print("\n  ".join(row))
    best = min(totals, key=totals.get)
    print(f"best INT{args.bits} GEMV config over the four projections: {best} ({totals[best] * 1e3:.0f} us a layer)")


if __name__ == "__main__":
    main()
