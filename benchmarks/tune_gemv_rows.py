"""Sweep the few-row GEMV (``brisk/layers/triton_gemv_rows.py``) on a GPU (not a test) for the Llama-3.1-8B
projections in bf16 beside cuBLAS, and time a layer stack of projections (with the separate RMSNorm and SiLU
kernels) through each at every row count: the row counts where the GEMV's stack is faster are the ones
``brisk.layers.fused.GEMV_MAX_ROWS`` should cover.

    python benchmarks/tune_gemv_rows.py [--rows 2,4,8,16,32] [--sweep-rows 4,16] [--layers 32] [--top 4]
        [--fp8-rows 8,16] [--int8-rows 8] [--shape llama-3.1-8b-shape]

``--shape``: the projections of another named shape (``brisk/bench/configs.py``), e.g. the speculative pair's
``qwen2.5-coder-1.5b-shape`` and ``qwen2.5-coder-0.5b-shape``, whose verification and draft passes run this GEMV at
``1 + k`` and 2 rows. Their projections are a few dozen tiles of 64 outputs (the 0.5B's o_proj 14), far fewer
programs than the GPU has multiprocessors; the sweep includes tiles of 16 outputs and K split in 2 to 6 slices.

``--fp8-rows``: each projection with FP8 weights (``quantization="fp8"``'s layout) through the weight-only FP8
GEMV, beside the bf16 GEMV and the ``torch._scaled_mm`` path that larger batches take (inputs quantized per
token, then the FP8 GEMM); ``--int8-rows`` the same with INT8 weights (W8A8's layout).

Timings as in ``tune_gemv.py``: CUDA graphs over distinct weight copies, so that no weight stays in L2.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F
import tune_gemv
from tune_gemv import graph_ms

from brisk.bench.configs import NAMED_CONFIGS
from brisk.layers import triton_gemv_rows, triton_ops
from brisk.layers.quantization.compressed_tensors.int8 import quantize_int8_per_row
from brisk.layers.quantization.fp8_utils import quantize_fp8_per_row
from brisk.layers.quantization.triton_fp8 import quantize_fp8_rows
from brisk.layers.triton_gemv_rows import GemvRowsConfig

DEFAULT_CONFIG = triton_gemv_rows.gemv_rows_config
SWEEP = [  # tiles whose pipelined loads fit in 160 KB of shared memory
    GemvRowsConfig(block_n, block_k, warps, stages)
    for block_n, block_k, warps, stages in itertools.product((16, 32, 64, 128), (128, 256), (4, 8), (2, 3, 4, 5))
    if (block_n + 16) * block_k * 2 * stages <= 160 * 1024 and (warps == 4 or block_n == 128)
] + [GemvRowsConfig(block_n, 256, 4, 4, split_k) for block_n in (16, 32, 64) for split_k in (2, 3, 4, 6)]
LAYER_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
FP8_CONFIGS = [GemvRowsConfig(*c) for c in ((64, 256, 4, 4), (32, 512, 4, 4), (16, 512, 4, 4), (32, 256, 2, 4))]


def use_shape(config: dict) -> None:
    """Time the projections of the HF ``config`` (tune_gemv's table, which its functions read)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    qkv = (heads + 2 * config.get("num_key_value_heads", heads)) * head_dim
    tune_gemv.HIDDEN = hidden
    tune_gemv.PROJECTIONS = {
        "qkv_proj": (qkv, hidden),
        "o_proj": (hidden, heads * head_dim),
        "gate_up_proj": (2 * config["intermediate_size"], hidden),
        "down_proj": (hidden, config["intermediate_size"]),
        "lm_head": (config["vocab_size"], hidden),
    }


def use(config: GemvRowsConfig | None) -> None:
    triton_gemv_rows.gemv_rows_config = DEFAULT_CONFIG if config is None else (lambda *rows_and_device: config)


def sweep_projection(name: str, rows: int, layers: int, top: int) -> None:
    n, k = tune_gemv.PROJECTIONS[name]
    copies = max(2, min(layers, int(4e9 // (n * k * 2))))
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)]
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")

    def us(linear: Callable) -> float:
        return graph_ms(lambda: [linear(x, w, None) for w in weights]) / copies * 1e3

    cublas = us(F.linear)
    results = []
    for config in [None, *SWEEP]:
        use(config)
        try:
            results.append((us(triton_gemv_rows.gemv_rows), config))
        except Exception as exc:  # a config the compiler rejects
            print(f"  skip {config}: {type(exc).__name__}")
    use(None)
    tb_s = n * k * 2 / cublas / 1e6
    print(f"{name} [{n} x {k}] x {copies}, {rows} rows: cuBLAS {cublas:7.1f} us/launch {tb_s:5.2f} TB/s")
    for time_us, config in results[:1] + sorted(results[1:], key=lambda r: r[0])[:top]:
        label = "default" if config is None else str(tuple(config))
        print(f"  {label:22s} {time_us:7.1f} us/launch {n * k * 2 / time_us / 1e6:5.2f} TB/s "
              f"({cublas / time_us:4.2f}x cuBLAS)")  # fmt: skip


def fp8_projection(name: str, rows: int, layers: int, fmt: str = "fp8") -> None:
    """One projection at ``rows`` rows: bf16 weights through the GEMV; FP8 (or INT8) weights through the
    weight-only 8-bit GEMV and through per-token input quantization plus ``torch._scaled_mm`` (FP8's GEMM, beside
    INT8 too as the yardstick)."""
    n, k = tune_gemv.PROJECTIONS[name]
    copies = max(2, min(layers, int(4e9 // (n * k * 2))))
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)]
    fp8 = [quantize_fp8_per_row(w) for w in weights]
    quantized = fp8 if fmt == "fp8" else [quantize_int8_per_row(w) for w in weights]
    eight_bit = [(q, None, s) for q, s in quantized]  # gemv_rows's weight, bias, scale
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")

    def scaled_mm(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        xq, x_scale = quantize_fp8_rows(x)
        return torch._scaled_mm(xq, qweight.t(), scale_a=x_scale, scale_b=scale.reshape(1, -1),
                                out_dtype=torch.bfloat16)  # fmt: skip

    def us(run: Callable) -> float:
        return graph_ms(run) / copies * 1e3

    bf16 = us(lambda: [triton_gemv_rows.gemv_rows(x, w, None) for w in weights])
    wide = []
    for config in FP8_CONFIGS:  # other tiles
        use(config)
        wide.append(f"{tuple(config)} {us(lambda: [triton_gemv_rows.gemv_rows(x, *w) for w in eight_bit]):.1f}")
    use(None)
    gemv = us(lambda: [triton_gemv_rows.gemv_rows(x, *w) for w in eight_bit])
    mm = us(lambda: [scaled_mm(q, s) for q, s in fp8])
    qweight, _, scale = eight_bit[0]
    ref = F.linear(x.float(), qweight.float() * scale)
    error = ((triton_gemv_rows.gemv_rows(x, qweight, None, scale).float() - ref).abs().max() / ref.abs().max()).item()
    print(f"{name} [{n} x {k}], {rows} rows: bf16 GEMV {bf16:6.1f} us; {fmt} GEMV {gemv:6.1f} us "
          f"({n * k / gemv / 1e6:4.2f} TB/s, {bf16 / gemv:4.2f}x bf16); quantize + FP8 _scaled_mm {mm:6.1f} us "
          f"({mm / gemv:4.2f}x the {fmt} GEMV's time); {fmt} GEMV max error {error:.1e} of the largest; other "
          f"tiles, us: {'; '.join(wide)}")  # fmt: skip


def layer_stack(rows: int, layers: int) -> None:
    """The projections of ``layers`` decoder layers at ``rows`` rows with the separate norm and activation
    kernels, through cuBLAS and through the GEMV."""
    dev, bf16 = "cuda", torch.bfloat16
    stack = [
        {name: 0.02 * torch.randn(*tune_gemv.PROJECTIONS[name], dtype=bf16, device=dev) for name in LAYER_PROJECTIONS}
        for _ in range(layers)
    ]
    hidden_size = tune_gemv.HIDDEN
    norm_w = torch.ones(hidden_size, dtype=bf16, device=dev)
    x0 = torch.randn(rows, hidden_size, dtype=bf16, device=dev)
    gbytes = sum(w.numel() * 2 for layer in stack for w in layer.values()) / 1e9

    def run(linear: Callable) -> torch.Tensor:
        hidden, residual = x0, None
        for w in stack:
            normed, residual = triton_ops.rms_norm(hidden, norm_w, 1e-5, residual) if residual is not None else (
                triton_ops.rms_norm(hidden, norm_w, 1e-5), hidden)  # fmt: skip
            attn = linear(normed, w["qkv_proj"], None)[:, :hidden_size].contiguous()  # attention is not timed here
            hidden = linear(attn, w["o_proj"], None)
            normed, residual = triton_ops.rms_norm(hidden, norm_w, 1e-5, residual)
            hidden = linear(triton_ops.silu_and_mul(linear(normed, w["gate_up_proj"], None)), w["down_proj"], None)
        return hidden

    base, ms = graph_ms(lambda: run(F.linear)), graph_ms(lambda: run(triton_gemv_rows.gemv_rows))
    out, ref = run(triton_gemv_rows.gemv_rows).float(), run(F.linear).float()
    error = ((out - ref).abs().max() / ref.abs().max()).item()
    print(f"{layers} layers, {rows} rows, {gbytes:.2f} GB: cuBLAS {base:6.3f} ms {gbytes / base:5.2f} TB/s; "
          f"GEMV {ms:6.3f} ms {gbytes / ms:5.2f} TB/s ({base / ms:4.2f}x); max difference {error:.2e} of the "
          "largest")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="2,4,8,16,32", help="row counts of the layer stacks")
    parser.add_argument("--sweep-rows", default="4,16", help="row counts of the config sweep (empty: none)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--fp8-rows", default="", help="row counts of the FP8 comparison (e.g. 8,16; empty: none)")
    parser.add_argument("--int8-rows", default="", help="row counts of the same comparison with INT8 weights")
    parser.add_argument("--shape", default="llama-3.1-8b-shape", choices=sorted(NAMED_CONFIGS),
                        help="whose projections to time")  # fmt: skip
    args = parser.parse_args()
    use_shape(NAMED_CONFIGS[args.shape])
    for fmt, counts in (("fp8", args.fp8_rows), ("int8", args.int8_rows)):
        for rows in [int(r) for r in counts.split(",") if r]:
            for name in LAYER_PROJECTIONS:
                fp8_projection(name, rows, args.layers, fmt)
    for rows in [int(r) for r in args.rows.split(",") if r]:
        layer_stack(rows, args.layers)
    for rows in [int(r) for r in args.sweep_rows.split(",") if r]:
        for name in LAYER_PROJECTIONS:
            sweep_projection(name, rows, args.layers, args.top)


if __name__ == "__main__":
    main()
