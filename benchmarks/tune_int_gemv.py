"""Batch-1 GEMV tiles for packed INT4/INT8 weights (``triton_int_gemm.GEMV_CONFIG``) and the FP8-weight GEMV, on
the Llama-3.1-8B projections: time per projection and the bandwidth it reaches, beside the bf16 GEMV; then how
``torch._scaled_mm`` (FP8, row-wise scales, bf16 out) accumulates, against the float64 product of its operands.

    python benchmarks/tune_int_gemv.py [--bits 4] [--group 128] [--rows 4,16] [--tinygemm 1,4,16]

``--rows``: the few-row INT GEMV (``gemv_rows_tile``'s choice and other tiles) at those row counts, beside
dequantizing for cuBLAS (what those rows took before it) and the bf16 and FP8 few-row GEMVs.
``--tinygemm``: at those row counts, PyTorch's own INT4 kernel (``torch._weight_int4pack_mm``, "tinygemm": groups
of 32 to 256, bf16 scales and float zero points) on the same symmetric weights beside brisk's Triton INT4 kernels,
and its largest difference from them; with a count above 16, the dequantization of either layout for cuBLAS
(``triton_int_gemm.dequantize_packed``, ``tinygemm.dequantize``) too. Run alone (no sweep).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from brisk.layers import triton_gemv, triton_gemv_rows  # noqa: E402
from brisk.layers.quantization import tinygemm, triton_int_gemm  # noqa: E402
from brisk.layers.quantization.fp8_utils import dequantize, quantize_fp8_per_row  # noqa: E402
from brisk.layers.quantization.packed_int import unpack_int32  # noqa: E402
from brisk.layers.quantization.triton_fp8 import quantize_fp8_rows  # noqa: E402
from brisk.layers.quantization.triton_int_gemm import GemvConfig, RowsTile  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
# (block_n, words, num_warps): words / (32 * num_warps) packed words a lane in each row.
CANDIDATES = [GemvConfig(4, 512, 4), GemvConfig(4, 256, 2), GemvConfig(2, 256, 2), GemvConfig(8, 256, 2),
              GemvConfig(2, 512, 4), GemvConfig(4, 128, 1)]  # fmt: skip


def warm_up() -> None:
    """A second of matrix products first: a GPU fresh from idle timed its first kernels up to 2x slow."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(500):
        a @ a
    torch.cuda.synchronize()


def sweep(bits: int, group: int, rounds: int = 2) -> None:
    """Each time is the best of ``rounds`` medians, the rounds taken over all shapes and configs in turn."""
    torch.manual_seed(0)
    dev, per_word = "cuda", 32 // bits
    runs: dict[tuple[str, str], tuple[GemvConfig | None, int, Callable[[], object]]] = {}
    for name, (n, k) in SHAPES.items():
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // per_word), device=dev, dtype=torch.int32)
        scales = torch.rand(n, k // group, device=dev, dtype=torch.bfloat16) * 0.01
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        int_gemv = partial(triton_int_gemm.int_weight_gemm, x, packed, scales, None, bits, group)
        for config in [*CANDIDATES, None]:  # None: the module's gemv_config rule
            label = str(tuple(config)) if config else "gemv_config"
            runs[name, label] = (config, packed.numel() * 4 + scales.numel() * 2, int_gemv)
        bf16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.01
        fp8, scale = quantize_fp8_per_row(bf16)
        runs[name, "bf16 gemv"] = (None, bf16.numel() * 2, partial(triton_gemv.gemv, x, bf16, None))
        runs[name, "fp8 gemv"] = (None, fp8.numel(), partial(triton_gemv.gemv, x, fp8, None, scale.view(-1)))
    best_ms: dict[tuple[str, str], float] = {}
    warm_up()
    for _ in range(rounds):
        for key, (config, _, call) in runs.items():
            triton_int_gemm.GEMV_CONFIG = config
            ms = do_bench(call, warmup=25, rep=100, return_mode="median")
            best_ms[key] = min(best_ms.get(key, float("inf")), ms)
    triton_int_gemm.GEMV_CONFIG = None
    for name in SHAPES:
        row = [f"{name:8s} {SHAPES[name][0]}x{SHAPES[name][1]}"]
        for (shape, label), (_, weight_bytes, _) in runs.items():
            if shape == name:
                ms = best_ms[shape, label]
                row.append(f"{label}: {ms * 1e3:.1f} us {weight_bytes / ms / 1e6:.0f} GB/s")
        print("\n  ".join(row), flush=True)
    totals = {str(tuple(config)): sum(best_ms[name, str(tuple(config))] for name in SHAPES) for config in CANDIDATES}
    best = min(totals, key=totals.get)
    rule = sum(best_ms[name, "gemv_config"] for name in SHAPES)
    print(f"best INT{bits} GEMV config over the four projections: {best} ({totals[best] * 1e3:.0f} us a layer); "
          f"gemv_config's per-shape choice: {rule * 1e3:.0f} us")  # fmt: skip


ROWS_TILES = [RowsTile(*t) for t in [(64, 128, 4, 3), (64, 256, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3),
                                    (32, 256, 4, 4), (32, 128, 4, 3), (32, 128, 2, 4), (64, 256, 4, 4),
                                    (64, 256, 8, 3), (128, 128, 8, 2)]]  # fmt: skip


def dequantized_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bits: int, group: int):
    return torch.nn.functional.linear(x, triton_int_gemm.dequantize_packed(packed, scales, None, bits, group))


def few_rows(bits: int, group: int, rows: int) -> None:
    """us per projection at ``rows`` rows: the few-row INT GEMV for each tile of ``ROWS_TILES``, dequantizing
    into bf16 for cuBLAS, and the bf16 and FP8 few-row GEMVs."""
    torch.manual_seed(0)
    dev, per_word = "cuda", 32 // bits
    warm_up()
    for name, (n, k) in SHAPES.items():
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // per_word), device=dev, dtype=torch.int32)
        scales = torch.rand(n, k // group, device=dev, dtype=torch.bfloat16) * 0.01
        x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
        bf16 = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.01
        fp8, scale = quantize_fp8_per_row(bf16)
        line = [f"{name:8s} {n}x{k}, {rows} rows:"]
        for tile in [*ROWS_TILES, None]:  # None: the module's gemv_rows_tile rule
            triton_int_gemm.GEMV_ROWS_TILE = tile
            ms = do_bench(partial(triton_int_gemm.int_weight_gemm, x, packed, scales, None, bits, group))
            line.append(f"INT{bits} {tuple(tile) if tile else 'gemv_rows_tile'} {ms * 1e3:.1f} us")
        triton_int_gemm.GEMV_ROWS_TILE = None
        dequantized = partial(dequantized_linear, x, packed, scales, bits, group)
        for label, call in [("dequantize + cuBLAS", dequantized),
                            ("bf16 GEMV", partial(triton_gemv_rows.gemv_rows, x, bf16, None)),
                            ("FP8 GEMV", partial(triton_gemv_rows.gemv_rows, x, fp8, None, scale))]:  # fmt: skip
            line.append(f"{label} {do_bench(call) * 1e3:.1f} us")
        print("\n  ".join(line), flush=True)


def scaled_mm_accumulation() -> None:
    """Max error over the largest magnitude and relative Frobenius error of ``torch._scaled_mm`` (qkv shape)
    against the float64 product of the same FP8 operands, with and without fast accumulation, beside the
    exact product rounded to bf16."""
    torch.manual_seed(0)
    qw, w_scale = quantize_fp8_per_row(0.02 * torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16))
    weight = dequantize(qw, w_scale).double()
    for rows in (7, 256):
        xq, x_scale = quantize_fp8_rows(torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16))
        exact = dequantize(xq, x_scale).double() @ weight.T
        line = [f"_scaled_mm rows={rows}:"]
        for label, fast in [("fast_accum=False", False), ("fast_accum=True", True), ("bf16(exact)", None)]:
            if fast is None:
                out = exact.to(torch.bfloat16)
            else:
                out = torch._scaled_mm(xq, qw.t(), scale_a=x_scale, scale_b=w_scale.reshape(1, -1),
                                       out_dtype=torch.bfloat16, use_fast_accum=fast)  # fmt: skip
            diff = out.double() - exact
            max_rel = (diff.abs().max() / exact.abs().max()).item()
            line.append(f"{label} max {max_rel:.2e} frobenius {(diff.norm() / exact.norm()).item():.2e}")
        print("  ".join(line))


def beside_tinygemm(group: int, row_counts: list[int]) -> None:
    """us per projection at each row count: brisk's INT4 kernels (``int_weight_gemm``) and PyTorch's tinygemm
    on the same symmetric 4-bit weights, whose dequantization ``(q - 8) * scale`` is tinygemm's with zero
    points of 0, and the largest difference of tinygemm's output from brisk's over brisk's largest magnitude."""
    torch.manual_seed(0)
    dev = "cuda"
    warm_up()
    for name, (n, k) in SHAPES.items():
        packed = torch.randint(-(2**31), 2**31 - 1, (n, k // 8), device=dev, dtype=torch.int32)
        scales = torch.rand(n, k // group, device=dev, dtype=torch.bfloat16) * 0.01
        int4pack, scales_and_zeros = tinygemm.pack(unpack_int32(packed, 4, dim=1), scales, None)
        line = [f"{name:8s} {n}x{k}, INT4 groups of {group}:"]
        if row_counts[-1] > 16:  # more rows dequantize for cuBLAS: brisk's layout and tinygemm's
            packed_us, layout_us = (do_bench(call, return_mode="median") * 1e3 for call in (
                partial(triton_int_gemm.dequantize_packed, packed, scales, None, 4, group),
                partial(tinygemm.dequantize, int4pack, scales_and_zeros, group)))  # fmt: skip
            line.append(f"dequantize: brisk's layout {packed_us:.1f} us, tinygemm's {layout_us:.1f} us")
        for rows in row_counts:
            x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            ours = partial(triton_int_gemm.int_weight_gemm, x, packed, scales, None, 4, group)
            theirs = partial(torch._weight_int4pack_mm, x, int4pack, group, scales_and_zeros)
            difference = ((theirs().float() - ours().float()).abs().max() / ours().float().abs().max()).item()
            brisk_us, tinygemm_us = (do_bench(call, return_mode="median") * 1e3 for call in (ours, theirs))
            line.append(f"{rows} rows: brisk {brisk_us:.1f} us, tinygemm {tinygemm_us:.1f} us, "
                        f"difference {difference:.1e}")  # fmt: skip
        print("\n  ".join(line), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--group", type=int, default=128)
    parser.add_argument("--rows", default="", help="row counts for the few-row INT GEMV (e.g. 4,16; empty: none)")
    parser.add_argument("--tinygemm", default="", help="row counts for PyTorch's INT4 kernel beside brisk's (1,4,16)")
    args = parser.parse_args()
    if args.tinygemm:
        beside_tinygemm(args.group, [int(r) for r in args.tinygemm.split(",")])
        return
    for rows in [int(r) for r in args.rows.split(",") if r]:
        few_rows(args.bits, args.group, rows)
    sweep(args.bits, args.group)
    scaled_mm_accumulation()


if __name__ == "__main__":
    main()
