"""Sweep the decode GEMV (``brisk/layers/triton_gemv.py``) on a GPU (not a test) for the Llama-3.1-8B shape in bf16,
beside cuBLAS, and time a whole batch-1 layer stack of projections fused and unfused.

    python benchmarks/tune_gemv.py [--layers 32] [--top 4]

Every timing is a CUDA graph of ``--layers`` launches over distinct weight copies, so that, as in a decode step,
no weight stays in L2 and the gaps between launches count. Bandwidth is weight bytes over time; the H200's measured
copy ceiling is about 4.3 TB/s. The configs are set by replacing ``triton_gemv.gemv_config`` for the sweep.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

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
    triton_gemv.gemv_config = DEFAULT_CONFIG if config is None else (lambda n, k: config)
    triton_gemv.pdl_launch_options = DEFAULT_PDL if pdl else (lambda device, num_tokens: {"USE_PDL": False})


def sweep_projection(name: str, layers: int, top: int) -> None:
    n, k = PROJECTIONS[name]
    copies = max(2, min(layers, int(4e9 // (n * k * 2))))
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    gbytes = n * k * 2 * copies / 1e9

    def chain(linear: Callable) -> Callable[[], None]:
        return lambda: [linear(x, w, None) for w in weights]

    cublas = graph_ms(chain(F.linear))
    results = []
    tiled = [
        GemvConfig(bn, bk, warps, 0)
        for bn, bk, warps in itertools.product((4, 8, 16), (1024, 2048, 4096), (4, 8))
        if bk <= triton.next_power_of_2(k) and bn * bk <= 128 * 32 * warps
    ]
    resident = [  # the input and up to two 32K-element weight tiles per program stay in registers
        GemvConfig(bn, triton.next_power_of_2(k), warps, per_sm)
        for bn, warps, per_sm in itertools.product((1, 2, 4, 8), (4, 8), (1, 2, 4, 8))
        if bn * triton.next_power_of_2(k) <= 32768
    ]
    configs = [None, *tiled, *resident]
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
    print(f"{name} [{n} x {k}] x {copies}: cuBLAS {cublas / copies * 1e3:7.1f} us/launch "
          f"{gbytes / cublas:5.2f} TB/s")  # fmt: skip
    ranked = sorted(results, key=lambda r: r[0])
    for ms, config, pdl in [r for r in results if r[1] is None] + ranked[:top]:
        label = "default" if config is None else str(tuple(config))
        print(f"  {label:20s} pdl={int(pdl)} {ms / copies * 1e3:7.1f} us/launch {gbytes / ms:5.2f} TB/s "
              f"({cublas / ms:4.2f}x cuBLAS)")  # fmt: skip


def layer_stack(layers: int) -> None:
    """The projections of ``layers`` decoder layers at batch 1: fused GEMVs vs separate norm and activation
    kernels with cuBLAS."""
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

    def fused() -> torch.Tensor:
        hidden, residual = x0, None
        for w in stack:
            qkv, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, w["qkv_proj"], None)
            hidden = triton_gemv.gemv(qkv[:, :HIDDEN], w["o_proj"], None)
            gate_up, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, w["gate_up_proj"], None)
            hidden = triton_gemv.silu_and_mul_gemv(gate_up, w["down_proj"], None)
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
    use(None, pdl=True)
    out, ref = fused().float(), unfused().float()
    print(f"  fused vs unfused: max difference {((out - ref).abs().max() / ref.abs().max()).item():.2e} of the largest")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--top", type=int, default=4)
    parser.add_argument("--projections", default=",".join(PROJECTIONS))
    parser.add_argument("--skip-sweep", action="store_true", help="Only time the layer stack.")
    args = parser.parse_args()
    if not args.skip_sweep:
        for name in args.projections.split(","):
            sweep_projection(name, args.layers, args.top)
    layer_stack(args.layers)


if __name__ == "__main__":
    main()
