"""What decode attention costs on a batch-1 step's critical path, against any dependent kernel (GPU, not a test).

32 layers of ``rms_norm+QKV GEMV -> X -> o_proj GEMV -> rms_norm+gate_up GEMV -> silu+down GEMV`` at the
Llama-3.1-8B shapes in bf16, captured in one CUDA graph (with PDL, as the engine runs them), where X is the decode
attention kernel (one sequence, several contexts, the engine's split count or one split, with and without its
rotary embedding), a minimal PDL kernel that waits and copies the query to the output, or nothing. Prints
microseconds per layer.

    python benchmarks/decode_chain_cost.py [--quick] [--contexts 128,256,384] [--launch tile_n=128,num_warps=8 ...]
        [--splits 4,8] [--gemv 4096x14336=8,1024,8,0 ...]

Each ``--launch`` adds the attention cases at the ``--contexts`` (256 and 1,024 unless given) with
``decode_attention``'s launch overrides (``tile_n``, ``min_partition``, ``num_warps``, ``num_stages``), so kernel
variants compare in one run. Each ``--gemv NxK=block_n,block_k,num_warps,programs_per_sm`` adds the attention case
at context 256 with that ``GemvConfig`` for the N x K projection (4096x14336 is the down projection).
``--splits`` adds the attention cases at the ``--contexts`` with those split counts (launch grids), and
``--quick`` leaves out the fixed cases but the chain without attention and attention at the ``--contexts``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from brisk.layers import triton_gemv
from brisk.layers.attention import triton_kernels as tk
from brisk.layers.pdl import allow_next_kernel, pdl_launch_options, wait_for_previous_kernel
from brisk.layers.rotary import RotaryEmbedding

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "gpu"))
from test_triton_gpu import SCALE, make_step  # noqa: E402

DEV, BF16, HIDDEN, LAYERS = "cuda", torch.bfloat16, 4096, 32


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    allow_next_kernel(USE_PDL)
    wait_for_previous_kernel(USE_PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _launch_overrides(text: str) -> dict[str, int]:
    overrides = {key: int(value) for key, value in (item.split("=") for item in text.split(","))}
    unknown = overrides.keys() - {"tile_n", "min_partition", "num_warps", "num_stages"}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown decode_attention launch override(s): {sorted(unknown)}")
    return overrides


def _int_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",")]


def _gemv_override(text: str) -> tuple[tuple[int, int], triton_gemv.GemvConfig]:
    shape, config = text.split("=")
    n, k = (int(v) for v in shape.split("x"))
    return (n, k), triton_gemv.GemvConfig(*(int(v) for v in config.split(",")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", type=_launch_overrides, action="append", default=[],
                        help="decode_attention launch overrides, e.g. tile_n=128,num_warps=8 (repeatable)")  # fmt: skip
    parser.add_argument("--contexts", type=_int_list, default=[256, 1024],
                        help="contexts of the --launch, --splits and --quick cases (W3: 128 to 384)")  # fmt: skip
    parser.add_argument("--gemv", type=_gemv_override, action="append", default=[],
                        help="one projection's GemvConfig, e.g. 4096x14336=8,1024,8,0 (repeatable)")  # fmt: skip
    parser.add_argument("--splits", type=_int_list, default=[],
                        help="split counts (launch grids) to compare with the engine's, at the --contexts")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="only the chain without attention and with attention at the --contexts")  # fmt: skip
    args = parser.parse_args()
    tuned_config = triton_gemv.gemv_config
    shapes = ((6144, HIDDEN), (HIDDEN, HIDDEN), (2 * 14336, HIDDEN), (HIDDEN, 14336))
    weights = [[0.02 * torch.randn(n, k, device=DEV, dtype=BF16) for n, k in shapes] for _ in range(LAYERS)]
    norm_w = torch.rand(HIDDEN, device=DEV, dtype=BF16) + 0.5
    x0 = torch.randn(1, HIDDEN, device=DEV, dtype=BF16)
    rope = RotaryEmbedding(128, 16384, {"rope_type": "default", "rope_theta": 500000.0}).to(DEV)
    out = torch.empty(1, 32, 128, device=DEV, dtype=BF16)

    def layers(mode: str, ctx: int, splits: int | None, rotary: bool, launch: dict[str, int]) -> None:
        cache, md, positions = steps[ctx]  # built outside the capture: no torch kernel between the chain's kernels
        rot = (rope.cos, rope.sin, positions) if rotary else None
        hidden, residual = x0, None
        for w_qkv, w_o, w_gate_up, w_down in weights:
            qkv, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, w_qkv, None)
            attn = qkv[:, :HIDDEN]
            if mode == "attention":
                q, k, v = (t.view(1, -1, 128) for t in qkv.split([4096, 1024, 1024], dim=1))
                tk.decode_attention(q, k, v, cache, out, md, SCALE, rot, num_splits=splits, **launch)
                attn = out.view(1, HIDDEN)
            elif mode == "copy":
                _copy_kernel[(8,)](qkv, out, HIDDEN, BLOCK=512, num_warps=4, **pdl_launch_options(qkv.device, 1))
                attn = out.view(1, HIDDEN)
            hidden = triton_gemv.gemv(attn, w_o, None)
            gate_up, residual = triton_gemv.rms_norm_gemv(hidden, residual, norm_w, 1e-5, w_gate_up, None)
            hidden = triton_gemv.silu_and_mul_gemv(gate_up, w_down, None)

    # The engine captures its graphs for max_model_len (4,096), which sets the split count; a context then uses
    # the splits its length fills, of one 64-key tile each at batch 1.
    engine_splits = tk.decode_num_splits(1, 8, 4096, torch.device(DEV))
    none = [("none", 256, None, True, {}, None)]
    if args.quick:
        cases = none + [("attention", ctx, engine_splits, True, {}, None) for ctx in args.contexts]
    else:
        cases = none + [("copy", 256, None, True, {}, None)]
        cases += [("attention", ctx, engine_splits, True, {}, None) for ctx in sorted({16, 256, 1024, *args.contexts})]
        cases += [("attention", 256, engine_splits, False, {}, None), ("attention", 256, 1, True, {}, None)]
    cases += [("attention", ctx, engine_splits, True, launch, None) for launch in args.launch for ctx in args.contexts]
    cases += [("attention", ctx, splits, True, {}, None) for splits in args.splits for ctx in args.contexts]
    cases += [("attention", 256, engine_splits, True, {}, gemv) for gemv in args.gemv]
    cases += none
    steps = {}
    for ctx in {case[1] for case in cases}:
        _, _, _, cache, md = make_step([(ctx, 1)], seed=1)
        steps[ctx] = cache, md, md.seq_lens.long() - 1
    for mode, ctx, splits, rotary, launch, gemv in cases:
        shape, config = gemv or (None, None)
        triton_gemv.gemv_config = tuned_config  # the engine's choice, or one projection's override for this case
        if gemv:
            triton_gemv.gemv_config = lambda n, k, *rest: config if (n, k) == shape else tuned_config(n, k, *rest)  # noqa: B023
        layers(mode, ctx, splits, rotary, launch)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layers(mode, ctx, splits, rotary, launch)
        for _ in range(3):
            graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) / 50 * 1000 / LAYERS
        detail = f"ctx {ctx:5d}, {splits:2d} splits, rotary {rotary}" if mode == "attention" else ""
        detail += "".join(f", {key} {value}" for key, value in launch.items())
        detail += f", {shape[0]}x{shape[1]}={','.join(map(str, config))}" if gemv else ""
        print(f"{mode:9s} {detail:60s} {us:7.2f} us per layer")


if __name__ == "__main__":
    main()
