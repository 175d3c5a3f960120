"""The Triton attention backend on a GPU, at Llama-3.1-8B attention shapes, against the torch reference.

Run with ``pytest tests/gpu/test_triton_gpu.py -s`` to see the error figures and the timing printout (timings
are information, not assertions).
"""

import dataclasses
from functools import partial

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
triton = pytest.importorskip("triton")

from brisk.layers.attention import default_backend  # noqa: E402
from brisk.layers.attention import triton_kernels as tk  # noqa: E402
from brisk.layers.attention.backend import AttentionMetadata, write_kv_cache  # noqa: E402
from brisk.layers.attention.long_prefill import long_chunk_seqs  # noqa: E402
from brisk.layers.attention.torch_ref import TorchAttentionImpl  # noqa: E402
from brisk.layers.attention.triton_backend import TritonAttentionImpl  # noqa: E402

DEV = torch.device("cuda")
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
SCALE = HEAD_SIZE**-0.5


def make_step(seqs, dtype=torch.bfloat16, seed=0, num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS,
              head_size=HEAD_SIZE, block_size=BLOCK_SIZE):  # fmt: skip
    """Random cache (all of it random; pages shuffled) and one step for ``seqs`` = [(seq_len, query_len)]."""
    gen = torch.Generator(device=DEV).manual_seed(seed)
    pages = [-(-s // block_size) for s, _ in seqs]
    num_blocks = sum(pages) + 1
    shape = (2, num_blocks, block_size, num_kv_heads, head_size)
    cache = torch.randn(shape, generator=gen, device=DEV).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen, device=DEV).to(torch.int32)
    tables = torch.zeros(len(seqs), max(pages), dtype=torch.int32, device=DEV)
    slots, used = [], 0
    for i, (seq_len, query_len) in enumerate(seqs):
        tables[i, : pages[i]] = perm[used : used + pages[i]]
        used += pages[i]
        pos = torch.arange(seq_len - query_len, seq_len, device=DEV)
        slots.append(tables[i, pos // block_size].long() * block_size + pos % block_size)
    starts = [0]
    for _, q in seqs:
        starts.append(starts[-1] + q)
    num_tokens = starts[-1]
    md = AttentionMetadata(
        num_tokens=num_tokens,
        num_seqs=len(seqs),
        max_query_len=max(q for _, q in seqs),
        max_seq_len=max(s for s, _ in seqs),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEV),
        seq_lens=torch.tensor([s for s, _ in seqs], dtype=torch.int32, device=DEV),
        block_tables=tables,
        slot_mapping=torch.cat(slots),
        query_start_loc_cpu=starts,
        seq_lens_cpu=[s for s, _ in seqs],
    )
    q = torch.randn(num_tokens, num_heads, head_size, generator=gen, device=DEV).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_size, generator=gen, device=DEV).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_size, generator=gen, device=DEV).to(dtype)
    return q, k, v, cache, md


def check(name, seqs, dtype=torch.bfloat16, seed=0, impl_cls=TritonAttentionImpl):
    """``impl_cls`` against the torch reference on one step: the same cache contents, and an error against an fp32
    ground truth within twice the reference's own bf16 error."""
    q, k, v, cache, md = make_step(seqs, dtype, seed)
    num_heads, num_kv_heads, head_size = q.shape[1], k.shape[1], q.shape[2]
    ref_impl = TorchAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5)
    # fp32 ground truth, and the torch reference in the same dtype as a yardstick for rounding error.
    ref32 = ref_impl.forward(q.float(), k.float(), v.float(), cache.float(), md)
    ref_cache = cache.clone()
    ref = ref_impl.forward(q, k, v, ref_cache, md)
    out = impl_cls(num_heads, num_kv_heads, head_size, head_size**-0.5).forward(q, k, v, cache, md)
    torch.cuda.synchronize()
    assert torch.equal(cache, ref_cache), "KV cache contents differ from write_kv_cache"
    assert torch.isfinite(out).all()
    err = (out.float() - ref32).abs().max().item()
    err_ref = (ref.float() - ref32).abs().max().item()
    err_vs_ref = (out.float() - ref.float()).abs().max().item()
    label = impl_cls.__name__.removesuffix("AttentionImpl").lower()
    print(f"\n  {name}: max|{label}-fp32ref| {err:.2e}  max|torch-fp32ref| {err_ref:.2e}  "
          f"max|{label}-torch| {err_vs_ref:.2e}  ({md.num_seqs} seqs, {md.num_tokens} tokens, "
          f"max ctx {md.max_seq_len}, decode-only {md.is_decode_only})")  # fmt: skip
    assert err <= 2 * err_ref + 1e-2, (err, err_ref)


def test_default_backend_is_triton():
    assert default_backend(DEV) == "triton"


@pytest.mark.parametrize("batch,max_ctx", [(1, 8192), (7, 8192), (64, 8192), (256, 2048)])
def test_decode_batches(batch, max_ctx):
    gen = torch.Generator().manual_seed(batch)
    ctx = torch.randint(1, max_ctx + 1, (batch,), generator=gen).tolist()
    ctx[0] = max_ctx
    check(f"decode b={batch} ctx<={max_ctx}", [(c, 1) for c in ctx], seed=batch)


@pytest.mark.parametrize(
    "name,seqs",
    [
        ("prefill 8k from scratch", [(8192, 8192)]),
        ("2k chunk on a 6k prefix hit", [(8192, 2048)]),
        (
            "mixed: chunks + 64 decodes",
            [(3000, 512), (700, 700), (4100, 37)] + [(64 * i + 5, 1) for i in range(64)],
        ),
        ("spec decode 1+4 x 16", [(1000 + 300 * i, 5) for i in range(16)]),
        ("many short prompts", [(100 + 7 * i, 100 + 7 * i) for i in range(48)]),
    ],
)
def test_prefill_and_mixed(name, seqs):
    check(name, seqs)


@pytest.mark.parametrize(
    "name,seqs",
    [
        ("12k prompt, second 6k chunk", [(12000, 6000)]),  # the fp32 reference of a 32k prompt needs 64 GB
        ("16k prompt from scratch", [(16384, 16384)]),
        ("two long chunks, one on a prefix hit", [(9000, 4096), (2500, 2500)]),
        ("a long chunk beside short chunks and decodes", [(700, 1), (12000, 6000), (3000, 40), (90, 90), (64, 1)]),
    ],
)
def test_long_chunks_take_cudnn_and_match_the_reference(name, seqs):
    """Long chunks take cuDNN's fused attention (split at the context, merged by log-sum-exp); the unified kernel
    computes the step's other sequences and skips theirs."""
    q, _, _, _, md = make_step(seqs)
    assert long_chunk_seqs(q, md) == [i for i, (_, n) in enumerate(seqs) if n >= 2048]
    assert long_chunk_seqs(q, dataclasses.replace(md, for_graph=True)) == []  # a graph's step stays on Triton
    check(name, seqs)


def test_long_chunks_with_an_fp8_cache():
    """The library path dequantizes an FP8 cache while gathering: it matches the Triton kernel on the same cache."""
    q, k, v, cache, md = make_step([(12000, 6000)])
    fp8 = cache.to(torch.float8_e4m3fn)
    impl = TritonAttentionImpl(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE)
    impl.k_scale = impl.v_scale = 0.5
    assert long_chunk_seqs(q, md) == [0]
    cudnn = impl.forward(q, k, v, fp8, md).float()  # writes the chunk's keys and values, then attends
    triton = tk.unified_attention(q, fp8, torch.empty_like(q), md.block_tables, md.seq_lens, md.query_start_loc,
                                  SCALE, md.num_seqs, md.max_query_len, k_scale=0.5, v_scale=0.5)  # fmt: skip
    err = (cudnn - triton.float()).abs().max().item()
    print(f"\n  fp8 cache, long chunk: max|cudnn-triton| {err:.2e}")
    assert err < 2e-2


@pytest.mark.parametrize("batch,ctx", [(1, 32000), (8, 32000), (256, 820)])
def test_bf16_decode_over_an_fp8_cache(batch, ctx):
    """The decode kernel over an FP8 cache (fp16 products from 2 sequences on, bf16 at batch 1) against the torch
    reference in float32 over the same FP8 cache and bf16 inputs, at W4's and W1's shapes."""
    q, k, v, cache, md = make_step([(ctx, 1)] * batch)
    fp8 = cache.to(torch.float8_e4m3fn)
    outs = []
    for impl_cls, args in ((TorchAttentionImpl, (q.float(), k.float(), v.float())), (TritonAttentionImpl, (q, k, v))):
        impl = impl_cls(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE)
        impl.k_scale = impl.v_scale = 0.5
        outs.append(impl.forward(*args, fp8.clone(), md).float())
    err = (outs[1] - outs[0]).abs().max().item()
    print(f"\n  fp8 cache, decode {batch} x {ctx}: max|triton-fp32ref| {err:.2e}")
    assert err < 2e-2


def test_fp16_and_other_head_sizes():
    check("fp16 mixed", [(2000, 300), (513, 1), (77, 77)], dtype=torch.float16)
    for head_size, qpk in [(64, 4), (256, 2), (128, 1), (128, 7)]:
        kv_heads = 2
        q, k, v, cache, md = make_step([(1500, 200), (900, 1), (33, 33)], torch.bfloat16, 1, kv_heads * qpk,
                                       kv_heads, head_size)  # fmt: skip
        ref_impl = TorchAttentionImpl(kv_heads * qpk, kv_heads, head_size, head_size**-0.5)
        ref32 = ref_impl.forward(q.float(), k.float(), v.float(), cache.float(), md)
        impl = TritonAttentionImpl(kv_heads * qpk, kv_heads, head_size, head_size**-0.5)
        out = impl.forward(q, k, v, cache, md)
        err = (out.float() - ref32).abs().max().item()
        # decode path too
        dq, dk, dv, dcache, dmd = make_step([(3000, 1), (17, 1)], torch.bfloat16, 2, kv_heads * qpk, kv_heads,
                                            head_size)  # fmt: skip
        dref = ref_impl.forward(dq.float(), dk.float(), dv.float(), dcache.float(), dmd)
        derr = (impl.forward(dq, dk, dv, dcache, dmd).float() - dref).abs().max().item()
        print(f"\n  head {head_size} gqa {qpk}: max err prefill {err:.2e} decode {derr:.2e}")
        assert err < 2e-2 and derr < 2e-2


def test_decode_cuda_graph_replay():
    """Capture the decode step once; replay it after changing the context lengths (same max bound)."""
    batch, bound = 16, 4096
    gen = torch.Generator().manual_seed(7)
    q, k, v, cache, md = make_step([(bound, 1)] * batch, seed=7)
    impl = TritonAttentionImpl(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE)
    impl.forward(q, k, v, cache, md)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = impl.forward(q, k, v, cache, md)
    for _ in range(3):
        new_lens = torch.randint(1, bound + 1, (batch,), generator=gen).to(torch.int32)
        md.seq_lens.copy_(new_lens)
        md.seq_lens_cpu = new_lens.tolist()
        pos = (new_lens - 1).to(DEV).long()
        pages = md.block_tables.gather(1, (pos // BLOCK_SIZE)[:, None])[:, 0].long()
        md.slot_mapping.copy_(pages * BLOCK_SIZE + pos % BLOCK_SIZE)
        q.copy_(torch.randn_like(q))
        graph.replay()
        ref_cache = cache.clone()
        ref = TorchAttentionImpl(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE).forward(q, k, v, ref_cache, md)
        torch.cuda.synchronize()
        assert (out.float() - ref.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("batch,ctx", [(1, 300), (1, 8192), (3, 2000), (64, 1024)])
def test_decode_with_rotary_in_a_cuda_graph(batch, ctx):
    """The decode kernel's own rotary embedding and cache write, split or not, replayed in a CUDA graph (the
    split counters must be reset by each launch): same cache and output as rotary + the torch reference."""
    from brisk.layers.rotary import RotaryEmbedding

    q, k, v, cache, md = make_step([(ctx, 1)] * batch, seed=11)
    rope = RotaryEmbedding(HEAD_SIZE, 16384, {"rope_type": "default", "rope_theta": 500000.0}).to(DEV)
    positions = (md.seq_lens - 1).long()
    ref_cache = cache.clone()
    ref = TorchAttentionImpl(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE).forward(
        q.clone(), k.clone(), v, ref_cache, md, rope, positions
    )
    out = torch.empty_like(q)
    rotary = (rope.cos, rope.sin, positions)
    tk.decode_attention(q, k, v, cache.clone(), out, md, SCALE, rotary)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tk.decode_attention(q, k, v, cache, out, md, SCALE, rotary)
    for _ in range(2):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        assert err < 2e-2, err
        # Rotation products may contract to FMAs here and not in torch: at most one bf16 rounding step apart.
        torch.testing.assert_close(cache, ref_cache, atol=0, rtol=8e-3)
    splits = tk.decode_num_splits(batch, NUM_KV_HEADS, ctx, DEV)
    print(f"\n  decode + rotary b={batch} ctx={ctx} splits={splits}: max|triton-torch| {err:.2e}")


def _bench(fn):
    """(µs with L2 flushed between calls, µs per call replayed in a CUDA graph)."""
    cold = triton.testing.do_bench(fn, warmup=10, rep=50)
    graphed = triton.testing.do_bench_cudagraph(fn, rep=50)
    return cold * 1e3, graphed * 1e3


def test_timing_printout():
    """Not an assertion: kernel speed at a glance (one layer's attention, Llama-3.1-8B shapes)."""
    kv_bytes_per_token = 2 * NUM_KV_HEADS * HEAD_SIZE * 2
    print(f"\n  H200 ceiling for reference: ~4.3 TB/s copy bandwidth. {torch.cuda.get_device_name()}")
    for batch, ctx in [(1, 1024), (1, 8192), (64, 1024), (64, 8192), (256, 1024)]:
        q, k, v, cache, md = make_step([(ctx, 1)] * batch, seed=3)
        out = torch.empty_like(q)
        splits = tk.decode_num_splits(batch, NUM_KV_HEADS, ctx, DEV)

        def run(q=q, k=k, v=v, cache=cache, out=out, md=md):
            tk.decode_attention(q, k, v, cache, out, md, SCALE)

        cold, graphed = _bench(run)
        gbytes = batch * ctx * kv_bytes_per_token / 1e9
        print(f"  decode b={batch:3d} ctx={ctx:5d} splits={splits:3d}: {cold:8.1f} us cold "
              f"({gbytes / cold * 1e3:6.0f} GB/s), {graphed:8.1f} us graphed "
              f"({gbytes / graphed * 1e3:6.0f} GB/s)")  # fmt: skip
        ref_impl = TorchAttentionImpl(NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, SCALE)
        if batch == 1:
            ms = triton.testing.do_bench(partial(ref_impl.forward, q, k, v, cache, md), warmup=5, rep=20)
            print(f"      (torch reference: {ms * 1e3:.1f} us)")
    wq, wk, wv, wcache, wmd = make_step([(1024, 1)] * 64, seed=4)
    ms = triton.testing.do_bench(lambda: tk.write_kv_cache(wk, wv, wcache, wmd.slot_mapping))
    print(f"  write_kv_cache 64 tokens: {ms * 1e3:.1f} us")

    for name, seqs in [("prefill 8k", [(8192, 8192)]), ("2k chunk on 6k prefix", [(8192, 2048)]),
                       ("4 x 1k prompts", [(1024, 1024)] * 4)]:  # fmt: skip
        q, k, v, cache, md = make_step(seqs, seed=5)
        write_kv_cache(k, v, cache, md.slot_mapping)
        out = torch.empty_like(q)

        def run(q=q, cache=cache, out=out, md=md):
            tk.unified_attention(q, cache, out, md.block_tables, md.seq_lens, md.query_start_loc, SCALE,
                                 md.num_seqs, md.max_query_len)  # fmt: skip

        ms = triton.testing.do_bench(run, warmup=10, rep=50)
        pairs = sum(ql * (s - ql) + ql * (ql + 1) / 2 for s, ql in seqs)
        tflops = 4 * NUM_HEADS * HEAD_SIZE * pairs / (ms * 1e-3) / 1e12
        line = f"  unified {name}: {ms * 1e3:8.1f} us, {tflops:5.0f} TFLOP/s (causal FLOPs)"
        if name == "prefill 8k":
            qs = q.transpose(0, 1)[None].contiguous()
            ks = torch.randn(1, NUM_HEADS, 8192, HEAD_SIZE, device=DEV, dtype=q.dtype)
            sdpa = partial(torch.nn.functional.scaled_dot_product_attention, qs, ks, ks, is_causal=True)
            sdpa_ms = triton.testing.do_bench(sdpa)
            line += f"; torch SDPA (contiguous, not paged) {sdpa_ms * 1e3:.1f} us"
        print(line)
