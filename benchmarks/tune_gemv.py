"""Sweep the decode GEMV (``brisk/layers/triton_gemv.py``) on a GPU (not a test) for the Llama-3.1-8B shape in bf16,
beside cuBLAS, and time a whole batch-1 layer stack of projections fused and unfused.

    python benchmarks/tune_gemv.py [--layers 32] [--top 4] [--weights bf16|fp8|int8] [--default-only]
    python benchmarks/tune_gemv.py --weights fp8 --skip-sweep --long-input-tiles 8x1024x8,16x1024x8,32x512x8

``--long-input-tiles`` also times the fused layer stack with each ``BLOCK_NxBLOCK_KxWARPS`` tile for the projections
whose input outgrows one tile (the down projection), bf16 and 8-bit weights alike, in the order the model runs them
(8-bit weights: the gate/up GEMV ends with SiLU-and-mul; bf16: the down GEMV starts with it, its tiled kernel
recomputing the activation in every program). The stack with the default tiles is also timed in the other order.

``--weights fp8`` or ``int8`` gives the GEMV 8-bit weights with a float32 scale per output row (weight-only FP8 or
INT8, as ``fused.scaled_dense`` calls it at one row; cuBLAS multiplies their bf16 dequantization) and tiles of up to
twice as many values; the layer stack then times the fused bf16 GEMVs beside the 8-bit ones.

Every timing is a CUDA graph of ``--layers`` launches over distinct weight copies, so that, as in a decode step,
no weight stays in L2 and the gaps between launches count. Bandwidth is weight bytes over time; the H200's measured
copy ceiling is about 4.3 TB/s. The configs are set by replacing ``triton_gemv.gemv_config`` for the sweep.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
import triton

from brisk.layers import triton_gemv, triton_ops
from brisk.layers.triton_gemv import GemvConfig

HIDDEN, INTERMEDIATE, VOCAB, QKV = 4096, 14336, 128256, 6144
PROJECTIONS = {  # name: (out features, in features)
    "qkv_proj": (QKV, HIDDEN),
    "o_proj": (HIDDEN, HIDDEN),
    "gate_up_proj": (2 * INTERMEDIATE, HIDDEN),
    "down_proj": (HIDDEN, INTERMEDIATE),
    "lm_head": (VOCAB, HIDDEN),
}
DEFAULT_CONFIG = triton_gemv.gemv_config
DEFAULT_PDL = triton_gemv.pdl_launch_options
WEIGHT_BYTES = {"bf16": 2, "fp8": 1, "int8": 1}


def quantized(weight: torch.Tensor, weights: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``weight`` in the format ``weights`` and its float32 scale per row (None for bf16)."""
    if weights == "bf16":
        return weight, None
    if weights == "fp8":
        from brisk.layers.quantization.fp8_utils import quantize_fp8_per_row as quantize
    else:
        from brisk.layers.quantization.compressed_tensors.int8 import quantize_int8_per_row as quantize
    q, scale = quantize(weight)
    return q, scale.reshape(-1)


def graph_ms(fn: Callable[[], object], replays: int = 20) -> float:
    """Milliseconds per replay of a CUDA graph of ``fn``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def use(config: GemvConfig | None, pdl: bool) -> None:
    triton_gemv.gemv_config = DEFAULT_CONFIG if config is None else (lambda n, k, *rest: config)
    triton_gemv.pdl_launch_options = DEFAULT_PDL if pdl else (lambda device, num_tokens: {"USE_PDL": False})


def sweep_projection(name: str, layers: int, top: int, weights_format: str, default_only: bool) -> None:
    n, k = PROJECTIONS[name]
    size = WEIGHT_BYTES[weights_format]
    copies = max(2, min(layers, int(4e9 // (n * k * size))))
    weights = [quantized(torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02, weights_format)
               for _ in range(copies)]  # fmt: skip
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    gbytes = n * k * size * copies / 1e9

    def chain(linear: Callable) -> Callable[[], None]:
        return lambda: [linear(x, w, None, scale) for w, scale in weights]

    if weights_format == "bf16":
        cublas = graph_ms(chain(lambda x, w, bias, scale: F.linear(x, w, bias)))
    else:  # the bf16 weight's read, for reference
        dense = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies)]
        cublas = graph_ms(lambda: [F.linear(x, w) for w in dense]) * size / 2
    results = []
    tiled = [
        GemvConfig(bn, bk, warps, 0)
        for bn, bk, warps in itertools.product((4, 8, 16), (1024, 2048, 4096, 8192), (4, 8))
        if bk <= triton.next_power_of_2(k) and bn * bk * size <= 256 * 32 * warps
    ]
    resident = [  # the input and up to two 64 KB weight tiles per program stay in registers
        GemvConfig(bn, triton.next_power_of_2(k), warps, per_sm)
        for bn, warps, per_sm in itertools.product((1, 2, 4, 8), (4, 8), (1, 2, 4, 8))
        if bn * triton.next_power_of_2(k) * size <= 65536
    ]
    configs = [None] if default_only else [None, *tiled, *resident]
    for config in configs:
        use(config, pdl=False)
        try:
            results.append((graph_ms(chain(triton_gemv.gemv)), config, False))
        except Exception as exc:  # a config the compiler rejects
            print(f"  skip {config}: {type(exc).__name__}")
    best = sorted(results[1:], key=lambda r: r[0])[:top]
    for _, config, _ in [results[0], *best]:
        use(config, pdl=True)
        results.append((graph_ms(chain(triton_gemv.gemv)), config, True))
    use(None, pdl=True)
    cublas_label = "cuBLAS" if weights_format == "bf16" else "cuBLAS bf16 scaled to these bytes"
    print(f"{name} [{n} x {k}] x {copies}, {weights_format}: {cublas_label} {cublas / copies * 1e3:7.1f} us/launch "
          f"{gbytes / cublas:5.2f} TB/s")  # fmt: skip
    ranked = sorted(results, key=lambda r: r[0])
    for ms, config, pdl in [r for r in results if r[1] is None] + ranked[:top]:
        label = "default" if config is None else str(tuple(config))
        print(f"  {label:20s} pdl={int(pdl)} {ms / copies * 1e3:7.1f} us/launch {gbytes / ms:5.2f} TB/s "
              f"({cublas / ms:4.2f}x cuBLAS)")  # fmt: skip


def layer_stack(layers: int, weights_format: str, long_input_tiles: Sequence[GemvConfig] = ()) -> None:
    """The projections of ``layers`` decoder layers at batch 1: fused GEMVs vs separate norm and activation
    kernels with cuBLAS; with 8-bit weights, the fused GEMVs on them too; then both with each of
    ``long_input_tiles`` for the inputs longer than 4096 (the down projection's)."""
    dev, bf16 = "cuda", torch.bfloat16
    names = [name for name in PROJECTIONS if name != "lm_head"]
    stack = [
        {name: 0.02 * torch.randn(*PROJECTIONS[name], dtype=bf16, device=dev) for name in names} for _ in range(layers)
    ]
    norm_w = torch.ones(HIDDEN, dtype=bf16, device=dev)
    x0 = torch.randn(1, HIDDEN, dtype=bf16, device=dev)
    gbytes = sum(w.numel() * 2 for layer in stack for w in layer.values()) / 1e9

    def unfused(linear: Callable = F.linear) -> torch.Tensor:
        hidden, residual = x0, None
        for w in stack:
            normed, residual = triton_ops.rms_norm(hidden, norm_w, 1e-5, residual) if residual is not None else (
                triton_ops.rms_norm(hidden, norm_w, 1e-5), hidden)  # fmt: skip
            attn = linear(normed, w["qkv_proj"], None)[:, :HIDDEN]  # attention itself is not part of this timing
            hidden = linear(attn, w["o_proj"], None)
            normed, residual = triton_ops.rms_norm(hidden, norm_w, 1e-5, residual)
            hidden = linear(triton_ops.silu_and_mul(linear(normed, w["gate_up_proj"], None)), w["down_proj"], None)
        return hidden

    plain = [{name: (w, None) for name, w in layer.items()} for layer in stack]

    def fused(weights: list[dict] | None = None, gated: bool | None = None) -> torch.Tensor:
        """The layers' fused GEMVs over ``weights`` (name -> weight and its row scales), by default ``plain``: the
        gate/up GEMV ends with SiLU-and-mul (``gated``) or the down GEMV starts with it; None: as the model runs
        them (``triton_gemv.fuses_silu_and_mul``)."""
        hidden, residual = x0, None
        for w in weights or plain:
            gate_up_w = w["gate_up_proj"][0]
            if gated is None:
                gated = triton_gemv.fuses_silu_and_mul(*gate_up_w.shape, gate_up_w.element_size())
            qkv, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, w["qkv_proj"][0], None,
                                                      w["qkv_proj"][1])  # fmt: skip
            hidden = triton_gemv.gemv(qkv[:, :HIDDEN], w["o_proj"][0], None, w["o_proj"][1])
            gate_up, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, w["gate_up_proj"][0], None,
                                                          w["gate_up_proj"][1], silu_and_mul=gated)  # fmt: skip
            if gated:
                hidden = triton_gemv.gemv(gate_up, w["down_proj"][0], None, w["down_proj"][1])
            else:
                hidden = triton_gemv.silu_and_mul_gemv(gate_up, w["down_proj"][0], None, w["down_proj"][1])
        return hidden

    base = graph_ms(unfused)
    print(f"{layers} layers of projections, batch 1, {gbytes:.2f} GB of weights:")
    print(f"  norm/activation kernels + cuBLAS  {base:6.3f} ms  {gbytes / base:5.2f} TB/s")
    separate = graph_ms(lambda: unfused(triton_gemv.gemv))
    tb_s = gbytes / separate
    print(f"  norm/activation kernels + GEMVs   {separate:6.3f} ms  {tb_s:5.2f} TB/s  ({base / separate:4.2f}x)")
    for pdl in (False, True):
        use(None, pdl)
        ms = graph_ms(fused)
        print(f"  fused GEMVs, pdl={int(pdl)}             {ms:6.3f} ms  {gbytes / ms:5.2f} TB/s  ({base / ms:4.2f}x)")
    ms = graph_ms(lambda: fused(gated=True))
    print(f"  the same, gate/up ending with SiLU {ms:6.3f} ms  {gbytes / ms:5.2f} TB/s  ({base / ms:4.2f}x)")
    use(None, pdl=True)
    out, ref = fused().float(), unfused().float()
    print(f"  fused vs unfused: max difference {((out - ref).abs().max() / ref.abs().max()).item():.2e} of the largest")
    eight_bit = None
    if weights_format != "bf16":
        eight_bit = [{name: quantized(w, weights_format) for name, w in layer.items()} for layer in stack]
        for gated, label in ((None, ""), (False, ", SiLU in the down GEMV")):
            ms = graph_ms(lambda gated=gated: fused(eight_bit, gated))
            print(f"  fused GEMVs, {weights_format} weights{label}    {ms:6.3f} ms  {gbytes / 2 / ms:5.2f} TB/s  "
                  f"({base / ms:4.2f}x)")  # fmt: skip
    for tile in long_input_tiles:
        triton_gemv.gemv_config = lambda n, k, *rest, tile=tile: tile if k > 4096 else DEFAULT_CONFIG(n, k, *rest)
        ms = graph_ms(fused)
        line = f"  long inputs in {tile.block_n} x {tile.block_k} tiles, {tile.num_warps} warps: bf16 {ms:6.3f} ms"
        if eight_bit is not None:
            line += f", {weights_format} {graph_ms(lambda: fused(eight_bit)):6.3f} ms"
        error = ((fused().float() - ref).abs().max() / ref.abs().max()).item()
        print(f"{line} (bf16 against unfused: {error:.2e} of the largest)")
    use(None, pdl=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--projections", default=",".join(PROJECTIONS))
    parser.add_argument("--skip-sweep", action="store_true", help="Only time the layer stack.")
    parser.add_argument("--weights", default="bf16", choices=list(WEIGHT_BYTES))
    parser.add_argument("--default-only", action="store_true", help="Time the default tiles only, no sweep.")
    parser.add_argument("--long-input-tiles", default="", help="Also time the stack with these tiles for long inputs.")
    args = parser.parse_args()
    if not args.skip_sweep:
        for name in args.projections.split(","):
            sweep_projection(name, args.layers, args.top, args.weights, args.default_only)
    tiles = [GemvConfig(*(int(v) for v in tile.split("x")), 0) for tile in args.long_input_tiles.split(",") if tile]
    layer_stack(args.layers, args.weights, tiles)


if __name__ == "__main__":
    main()
