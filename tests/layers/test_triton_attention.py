"""The Triton attention backend against the torch reference, on tiny shapes.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set in tests/conftest.py).
"""

import pytest  # noqa: E402
import torch

pytest.importorskip("triton")

from brisk.layers.attention import default_backend, get_attn_impl_cls  # noqa: E402
from brisk.layers.attention import triton_kernels as tk  # noqa: E402
from brisk.layers.attention.backend import AttentionMetadata, write_kv_cache  # noqa: E402
from brisk.layers.attention.long_prefill import long_chunk_seqs, long_prefill_attention  # noqa: E402
from brisk.layers.attention.torch_ref import TorchAttentionImpl  # noqa: E402
from brisk.layers.attention.triton_backend import TritonAttentionImpl, _mixes_short_and_long  # noqa: E402
from brisk.layers.rotary import RotaryEmbedding  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = 1e-4


def make_batch(
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    *,
    pad_tokens: int = 0,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """A random step for ``seqs`` = [(seq_len, query_len)]: shuffled pages, unwritten cache slots are NaN.

    The cached prefix of each sequence (its first ``seq_len - query_len`` tokens) holds random values; the
    step's own keys/values are returned for the backend to write. ``pad_tokens`` extra query rows with slot -1
    follow the real ones (as a padded CUDA-graph batch would have).
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-s // block_size) for s, _ in seqs]
    num_blocks = sum(pages_per_seq) + 3
    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_size), float("nan"))
    perm = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.zeros(len(seqs), max(pages_per_seq + [1]) + 2, dtype=torch.int32)
    slots, used = [], 0
    for i, (seq_len, query_len) in enumerate(seqs):
        pages = perm[used : used + pages_per_seq[i]]
        used += pages_per_seq[i]
        block_tables[i, : len(pages)] = pages.to(torch.int32)
        for t in range(seq_len):
            page, off = int(pages[t // block_size]), t % block_size
            if t < seq_len - query_len:
                cache[:, page, off] = torch.randn(2, num_kv_heads, head_size, generator=gen)
            else:
                slots.append(page * block_size + off)
    num_tokens = len(slots) + pad_tokens
    slots += [-1] * pad_tokens
    starts = [0]
    for _, query_len in seqs:
        starts.append(starts[-1] + query_len)
    metadata = AttentionMetadata(
        num_tokens=num_tokens,
        num_seqs=len(seqs),
        max_query_len=max(q for _, q in seqs),
        max_seq_len=max(s for s, _ in seqs),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor([s for s, _ in seqs], dtype=torch.int32, device=DEVICE),
        block_tables=block_tables.to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        query_start_loc_cpu=starts,
        seq_lens_cpu=[s for s, _ in seqs],
    )

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    q = rand(num_tokens, num_heads, head_size)
    k = rand(num_tokens, num_kv_heads, head_size)
    v = rand(num_tokens, num_kv_heads, head_size)
    return q, k, v, cache.to(device=DEVICE, dtype=dtype), metadata


def reference(q, k, v, cache, metadata):
    num_heads, num_kv_heads, head_size = q.shape[1], k.shape[1], q.shape[2]
    impl = TorchAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5)
    cache = cache.clone()
    out = impl.forward(q, k, v, cache, metadata)
    return out[: metadata.query_start_loc_cpu[-1]], cache


def assert_close(out, ref, atol=ATOL):
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, atol=atol, rtol=1e-4)


# A prefill chunk on a cached prefix, a fresh prefill, decodes (one at context 1), and a small extend.
MIXED = [(45, 13), (29, 29), (17, 1), (1, 1), (9, 3)]


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [
        (2, 2, 16, 8),  # MHA
        (4, 2, 32, 16),  # GQA 2
        (8, 2, 64, 8),  # GQA 4
        (4, 1, 16, 16),  # GQA 4, one kv head
        (6, 2, 32, 8),  # GQA 3 (not a power of two, like Qwen2's 7)
        (2, 1, 48, 16),  # head size not a power of two
    ],
)
def test_mixed_batch_matches_reference(num_heads, num_kv_heads, head_size, block_size):
    q, k, v, cache, md = make_batch(MIXED, num_heads, num_kv_heads, head_size, block_size, pad_tokens=2)
    ref, ref_cache = reference(q, k, v, cache, md)
    impl = get_attn_impl_cls("triton")(num_heads, num_kv_heads, head_size, head_size**-0.5)
    out = impl.forward(q, k, v, cache, md)
    assert_close(out[: md.query_start_loc_cpu[-1]], ref)
    torch.testing.assert_close(cache, ref_cache, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_size", [(4, 2, 32), (6, 2, 48), (2, 1, 80)])
def test_rotary_in_the_cache_writer_matches_rotary_then_reference(num_heads, num_kv_heads, head_size):
    """The Triton backend rotates q/k in the kernel that writes the cache: same cache, same output as the
    reference backend given the same rotary embedding (head sizes whose half is not a power of two included)."""
    q, k, v, cache, md = make_batch(MIXED, num_heads, num_kv_heads, head_size, 8, pad_tokens=2)
    rope = RotaryEmbedding(head_size, 64, {"rope_type": "default", "rope_theta": 10000.0}).to(DEVICE)
    positions = torch.randint(0, 64, (md.num_tokens,), device=DEVICE)
    ref_cache = cache.clone()
    ref = TorchAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5).forward(
        q.clone(), k.clone(), v, ref_cache, md, rope, positions
    )
    impl = TritonAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5)
    out = impl.forward(q, k, v, cache, md, rope, positions)
    real = md.query_start_loc_cpu[-1]
    assert_close(out[:real], ref[:real])
    torch.testing.assert_close(cache, ref_cache, equal_nan=True, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("block_m,tile_n", [(16, 16), (32, 32), (64, 16), (128, 64)])
def test_unified_tile_shapes(block_m, tile_n):
    """Other tilings: several KV tiles per page and pages per tile, query blocks spanning few/many tokens."""
    q, k, v, cache, md = make_batch(MIXED, 4, 2, 16, 8, seed=1)
    ref, _ = reference(q, k, v, cache, md)
    write_kv_cache(k, v, cache, md.slot_mapping)
    out = torch.empty_like(q)
    tk.unified_attention(
        q, cache, out, md.block_tables, md.seq_lens, md.query_start_loc, 16**-0.5, md.num_seqs,
        md.max_query_len, block_m=block_m, tile_n=tile_n,
    )  # fmt: skip
    assert_close(out, ref)


@pytest.mark.parametrize("seqs", [[(45, 13)], [(29, 29)], [(70, 9), (40, 40), (33, 12)]])
@pytest.mark.parametrize("kv_cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_long_prefill_split_at_the_context_matches_reference(seqs, kv_cache_dtype):
    """The library path for long chunks (each chunk over its context, unmasked, and over itself, causal, merged
    by their log-sum-exps) gives the reference's attention; here through torch's CPU flash kernel, on GPUs
    through cuDNN's (tests/gpu). An FP8 cache is dequantized while its pages are gathered."""
    num_heads, num_kv_heads, head_size = 8, 2, 32
    q, k, v, cache, md = make_batch(seqs, num_heads, num_kv_heads, head_size, 8, seed=3)
    ref_impl = TorchAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5)
    cache = cache.nan_to_num().to(kv_cache_dtype)  # NaN has no FP8 encoding; unwritten slots are never read
    k_scale = v_scale = 1.0 if kv_cache_dtype == torch.float32 else 0.5
    ref_impl.k_scale, ref_impl.v_scale = k_scale, v_scale
    ref = ref_impl.forward(q, k, v, cache, md)
    out = long_prefill_attention(q, cache, torch.empty_like(q), md, list(range(len(seqs))), head_size**-0.5, k_scale,
                                 v_scale)  # fmt: skip
    assert_close(out, ref)
    assert long_chunk_seqs(q, md) == []  # a float32 CPU step stays on the Triton kernel in a model


def test_unified_skips_flagged_sequences_for_the_long_chunk_path():
    """A step whose long chunks take the library path: the unified kernel leaves their rows alone and computes the
    rest; together they give the reference's attention."""
    num_heads, num_kv_heads, head_size = 4, 2, 32
    q, k, v, cache, md = make_batch(MIXED, num_heads, num_kv_heads, head_size, 8, seed=5)
    ref, _ = reference(q, k, v, cache, md)
    write_kv_cache(k, v, cache, md.slot_mapping)
    long = [0, 1]  # the chunk on a cached prefix and the fresh prompt
    out = torch.full_like(q, float("nan"))
    skip = torch.tensor([int(i in long) for i in range(md.num_seqs)], dtype=torch.int32, device=DEVICE)
    tk.unified_attention(
        q, cache, out, md.block_tables, md.seq_lens, md.query_start_loc, head_size**-0.5, md.num_seqs,
        md.max_query_len, skip_seqs=skip,
    )  # fmt: skip
    skipped_rows = md.query_start_loc_cpu[2]
    assert out[:skipped_rows].isnan().all()
    assert_close(out[skipped_rows:], ref[skipped_rows:])
    long_prefill_attention(q, cache.nan_to_num(), out, md, long, head_size**-0.5)
    assert_close(out, ref)


def test_unified_over_a_packed_graph_layout():
    """The layout a packed (mixed-step) CUDA graph replays: the real rows packed, then a padding sequence of rows
    that write no KV and read unwritten (NaN) slots, then empty sequences up to the graph's count, the launch sized
    for the graph (its token count as the longest query). The real rows equal the plain step's."""
    num_heads, num_kv_heads, head_size, block_size = 4, 2, 32, 8
    q, k, v, cache, md = make_batch(MIXED, num_heads, num_kv_heads, head_size, block_size, seed=4)
    ref, _ = reference(q, k, v, cache, md)
    write_kv_cache(k, v, cache, md.slot_mapping)
    real, tokens, seqs = md.num_tokens, 64, 8
    pad = tokens - real
    seq_lens = md.seq_lens_cpu + [pad] + [0] * (seqs - len(MIXED) - 1)
    starts = md.query_start_loc_cpu + [tokens] * (seqs - len(MIXED))
    block_tables = torch.zeros(seqs, md.block_tables.shape[1], dtype=torch.int32, device=DEVICE)
    block_tables[: len(MIXED)] = md.block_tables
    block_tables[len(MIXED)] = md.block_tables[1]  # a real sequence's pages: the padding reads, never writes
    padded_q = torch.cat([q, torch.randn(pad, num_heads, head_size, device=DEVICE)])
    out = torch.full_like(padded_q, float("nan"))
    tk.unified_attention(
        padded_q, cache, out, block_tables, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        torch.tensor(starts, dtype=torch.int32, device=DEVICE), head_size**-0.5, seqs, tokens,
    )  # fmt: skip
    assert_close(out[:real], ref)


# Prompt chunks of more than short_query_len(4) = 15 tokens beside decodes and a 3-token extend.
DECODES_BESIDE_PROMPTS = [(80, 40), (17, 1), (1, 1), (50, 20), (9, 3), (33, 1)]


def test_decodes_beside_prompts_take_their_own_launch():
    """A step that mixes decodes with prompt chunks: the long sequences take one launch (the prompts' tile), the
    short ones another (a 16-row tile), each leaving the other's rows unwritten; the backend's two launches equal
    the reference."""
    num_heads, num_kv_heads, head_size, block_size = 8, 2, 32, 8
    seqs = DECODES_BESIDE_PROMPTS
    q, k, v, cache, md = make_batch(seqs, num_heads, num_kv_heads, head_size, block_size, seed=6)
    ref, ref_cache = reference(q, k, v, cache, md)
    short = tk.short_query_len(num_heads // num_kv_heads)
    is_short = torch.tensor([n for _, n in seqs]).repeat_interleave(torch.tensor([n for _, n in seqs])) <= short
    assert is_short.any() and not is_short.all()

    assert _mixes_short_and_long(md, short)  # the backend takes both launches
    out = TritonAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5).forward(q, k, v, cache, md)
    assert_close(out, ref)
    torch.testing.assert_close(cache, ref_cache, equal_nan=True, atol=0, rtol=0)

    step = (md.block_tables, md.seq_lens, md.query_start_loc, head_size**-0.5, md.num_seqs)
    for seq_filter, rows, max_query_len in (
        (tk.SEQS_LONG, ~is_short, md.max_query_len),
        (tk.SEQS_SHORT, is_short, short),
    ):
        part = torch.full_like(q, float("nan"))
        tk.unified_attention(q, cache, part, *step, max_query_len, seq_filter=seq_filter.value)
        assert_close(part[rows], ref[rows])
        assert part[~rows].isnan().all()


@pytest.mark.parametrize(
    "seqs,mixes",
    [
        ([(64, 64), (0, 0), (0, 0)], True),  # a packed mixed-step graph's capture: a padding sequence, empty ones
        ([(40, 4), (90, 4), (7, 4)], False),  # speculative verification of 1 + 3 rows with 16 query heads a KV head
        ([(40, 1), (90, 3)], False),  # decodes and short drafts only
    ],
    ids=["packed-capture", "verification", "short-only"],
)
def test_launch_choice_follows_the_metadata(seqs, mixes):
    """The one-or-two-launch choice reads the step's metadata alone, so a CUDA graph's warm-up and its capture
    (same metadata) take the same launches and no kernel is first compiled inside a capture; the packed graphs'
    empty sequences make their capture take both launches."""
    md = make_batch(seqs, 16, 1, 32, 8)[-1]
    assert _mixes_short_and_long(md, tk.short_query_len(16)) is mixes


def test_unified_handles_empty_query_and_strided_io():
    """A sequence with no query token this step; query/output as strided views of fused buffers."""
    seqs = [(12, 4), (20, 0), (7, 7), (30, 1)]
    num_heads, num_kv_heads, head_size = 4, 2, 32
    q, k, v, cache, md = make_batch(seqs, num_heads, num_kv_heads, head_size, 8, seed=2)
    ref, _ = reference(q, k, v, cache, md)
    write_kv_cache(k, v, cache, md.slot_mapping)
    fused = torch.zeros(q.shape[0], num_heads + 2, head_size, device=DEVICE)
    fused[:, :num_heads] = q
    out_buf = torch.zeros(q.shape[0], num_heads + 1, head_size, device=DEVICE)
    out = out_buf[:, 1:]
    tk.unified_attention(
        fused[:, :num_heads], cache, out, md.block_tables, md.seq_lens, md.query_start_loc,
        head_size**-0.5, md.num_seqs, md.max_query_len,
    )  # fmt: skip
    assert_close(out, ref)
    assert (out_buf[:, 0] == 0).all()


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [(2, 2, 16, 8), (4, 2, 32, 16), (4, 1, 64, 8), (3, 1, 48, 16)],
)
@pytest.mark.parametrize("seqs", [[(70, 1), (1, 1), (33, 1), (50, 1)], [(70, 1)]])
def test_decode_split_kv_matches_reference(seqs, num_heads, num_kv_heads, head_size, block_size):
    """Decode-only batch with several partitions per sequence, including splits left empty by short ones: the
    kernel stores the step's keys/values itself and the last split of each group merges the partials. A single
    sequence takes the kernel's other path (its first KV tile loaded before the wait for the QKV projection)."""
    q, k, v, cache, md = make_batch(seqs, num_heads, num_kv_heads, head_size, block_size, seed=3)
    ref, ref_cache = reference(q, k, v, cache, md)
    for num_splits in (1, 4, 8):
        out, step_cache = torch.full_like(q, float("nan")), cache.clone()
        tk.decode_attention(q, k, v, step_cache, out, md, head_size**-0.5, num_splits=num_splits, tile_n=16,
                            min_partition=16)  # fmt: skip
        assert_close(out, ref)
        torch.testing.assert_close(step_cache, ref_cache, equal_nan=True, atol=0, rtol=0)
        assert (tk._split_counters(q.device) == 0).all(), "a split launch must leave its counters zeroed"
    # The unified kernel must agree on decode rows too.
    write_kv_cache(k, v, cache, md.slot_mapping)
    out = torch.full_like(q, float("nan"))
    tk.unified_attention(
        q, cache, out, md.block_tables, md.seq_lens, md.query_start_loc, head_size**-0.5, md.num_seqs, 1
    )
    assert_close(out, ref)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("seq_lens", [[40, 7, 19], [40]])
def test_decode_applies_rotary_and_writes_the_rotated_key(seq_lens, num_splits):
    """With a rotary embedding the decode kernel rotates q and the new key itself: same output and cache as
    the reference backend, which rotates first (head size 48: a half that is not a power of two)."""
    num_heads, num_kv_heads, head_size = 6, 2, 48
    q, k, v, cache, md = make_batch([(n, 1) for n in seq_lens], num_heads, num_kv_heads, head_size, 8, seed=9)
    rope = RotaryEmbedding(head_size, 64, {"rope_type": "default", "rope_theta": 10000.0}).to(DEVICE)
    positions = torch.tensor([n - 1 for n in seq_lens], device=DEVICE)
    ref_cache = cache.clone()
    ref = TorchAttentionImpl(num_heads, num_kv_heads, head_size, head_size**-0.5).forward(
        q.clone(), k.clone(), v, ref_cache, md, rope, positions
    )
    out = torch.full_like(q, float("nan"))
    rotary = (rope.cos, rope.sin, positions)
    tk.decode_attention(q, k, v, cache, out, md, head_size**-0.5, rotary, num_splits=num_splits, tile_n=16,
                        min_partition=16)  # fmt: skip
    assert_close(out, ref)
    torch.testing.assert_close(cache, ref_cache, equal_nan=True, atol=1e-6, rtol=1e-6)


def test_decode_through_backend_heuristics():
    """The backend's own choice: a long context (several 128-key partitions) and a batch of short ones."""
    for seed, seqs in enumerate([[(300, 1)], [(40, 1), (3, 1), (25, 1)]]):
        q, k, v, cache, md = make_batch(seqs, 4, 1, 16, 16, seed=4 + seed)
        assert md.is_decode_only
        ref, ref_cache = reference(q, k, v, cache, md)
        out = TritonAttentionImpl(4, 1, 16, 16**-0.5).forward(q, k, v, cache, md)
        assert_close(out, ref)
        torch.testing.assert_close(cache, ref_cache, equal_nan=True, atol=0, rtol=0)
    assert tk.decode_num_splits(1, 1, 300, torch.device("cpu")) == 3


def test_decode_splits_fill_the_program_slots_once():
    """A split launch never holds more programs than the GPU runs at once (the extra ones would run as a second
    wave on a few SMs: 5 splits at batch 8 x 32k keys took 344 us on the H200, the 4 chosen here 256 us), and
    holds as many as fit, unless the context is too short to split further. On the CPU the H200's 132 SMs."""
    device = torch.device("cpu")
    slots = tk.DECODE_PROGRAMS_PER_SM * tk.num_sms(device)
    for batch in range(1, 70):
        for context in (300, 4096, 33000):
            splits = tk.decode_num_splits(batch, 8, context, device)
            groups = batch * 8
            assert splits == 1 or splits * groups <= slots
            useful = -(-context // tk.DECODE_MIN_PARTITION)
            assert splits in (useful, tk.DECODE_MAX_SPLITS) or (splits + 1) * groups > slots
    assert [tk.decode_num_splits(b, 8, 33000, device) for b in (1, 2, 8, 16, 64)] == [33, 16, 4, 2, 1]


@pytest.mark.parametrize("seq_len", [1, 2, 16, 17, 33, 65])
def test_decode_single_sequence_partition_edges(seq_len):
    """One sequence (the path that loads its first KV tile before waiting) at lengths around the 16-key tile:
    a split holding only the new token, a first tile exactly full, a context of the new token alone."""
    q, k, v, cache, md = make_batch([(seq_len, 1)], 4, 2, 32, 8, seed=seq_len)
    ref, ref_cache = reference(q, k, v, cache, md)
    for num_splits in (1, 2, 4, 8):
        out, step_cache = torch.full_like(q, float("nan")), cache.clone()
        tk.decode_attention(q, k, v, step_cache, out, md, 32**-0.5, num_splits=num_splits, tile_n=16,
                            min_partition=16)  # fmt: skip
        assert_close(out, ref)
        torch.testing.assert_close(step_cache, ref_cache, equal_nan=True, atol=0, rtol=0)


def test_decode_merge_takes_partitions_in_several_chunks():
    """With one warp the merge holds 4 partitions of a 4-head group at a time (head size 64), fewer than the 5 to 8
    that these contexts use: the merge's rescale across chunks must be exact."""
    q, k, v, cache, md = make_batch([(128, 1), (90, 1)], 8, 2, 64, 8, seed=11)
    ref, ref_cache = reference(q, k, v, cache, md)
    out, step_cache = torch.full_like(q, float("nan")), cache.clone()
    tk.decode_attention(q, k, v, step_cache, out, md, 64**-0.5, num_splits=8, tile_n=16, min_partition=16,
                        num_warps=1)  # fmt: skip
    assert_close(out, ref)
    torch.testing.assert_close(step_cache, ref_cache, equal_nan=True, atol=0, rtol=0)


@pytest.mark.parametrize("pad_len,pad_block", [(1, 10**6), (0, 0)])
def test_decode_padding_rows_are_harmless(pad_len, pad_block):
    """Padding rows of a CUDA-graph batch with slot -1 neither crash, nor write, nor produce NaN. As
    InputBuffers.fill_padding makes them (a one-token context, here with block ids far outside the cache) the
    new-token branch runs and the output is the row's own value; an empty context (length 0) gives zeros."""
    q, k, v, cache, md = make_batch([(20, 1), (9, 1)], 4, 2, 16, 8, seed=6 + pad_len)
    ref, ref_cache = reference(q, k, v, cache, md)
    pad = 2
    q_pad, k_pad, v_pad = (torch.cat([t, torch.randn(pad, *t.shape[1:], device=DEVICE)]) for t in (q, k, v))
    pad_tables = torch.full((pad, md.block_tables.shape[1]), pad_block, dtype=torch.int32, device=DEVICE)
    padded = AttentionMetadata(
        num_tokens=md.num_tokens + pad,
        num_seqs=md.num_seqs + pad,
        max_query_len=1,
        max_seq_len=64,
        query_start_loc=torch.arange(md.num_seqs + pad + 1, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.cat([md.seq_lens, torch.full((pad,), pad_len, dtype=torch.int32, device=DEVICE)]),
        block_tables=torch.cat([md.block_tables, pad_tables]),
        slot_mapping=torch.cat([md.slot_mapping, torch.full((pad,), -1, device=DEVICE)]),
        query_start_loc_cpu=list(range(md.num_seqs + pad + 1)),
        seq_lens_cpu=md.seq_lens_cpu + [pad_len] * pad,
    )
    expected_padding = v_pad[md.num_seqs :].repeat_interleave(2, dim=1) if pad_len else torch.zeros_like(q_pad[:pad])
    for num_splits in (1, 4):
        out, step_cache = torch.full_like(q_pad, float("nan")), cache.clone()
        tk.decode_attention(q_pad, k_pad, v_pad, step_cache, out, padded, 0.25, num_splits=num_splits, tile_n=16,
                            min_partition=16)  # fmt: skip
        assert_close(out[: md.num_seqs], ref)
        torch.testing.assert_close(out[md.num_seqs :], expected_padding)
        torch.testing.assert_close(step_cache, ref_cache, equal_nan=True, atol=0, rtol=0)


def test_fp16_mixed_and_decode():
    """16-bit inputs (probabilities rounded to fp16 before the PV product), against an fp32 reference."""
    for seqs in (MIXED, [(60, 1), (5, 1), (37, 1)]):
        q, k, v, cache, md = make_batch(seqs, 4, 2, 32, 16, seed=8, dtype=torch.float16)
        ref, _ = reference(q.float(), k.float(), v.float(), cache.float(), md)
        impl = TritonAttentionImpl(4, 2, 32, 32**-0.5)
        if md.is_decode_only:
            out = torch.empty_like(q)
            tk.decode_attention(q, k, v, cache, out, md, 32**-0.5, num_splits=3, tile_n=16, min_partition=16)
        else:
            out = impl.forward(q, k, v, cache, md)
        assert out.dtype == torch.float16
        assert_close(out.float(), ref, atol=3e-3)


def test_write_kv_cache_matches_reference():
    num_tokens, num_kv_heads, head_size, block_size, num_blocks = 11, 3, 32, 8, 6
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, device=DEVICE)
    slots = torch.randperm(num_blocks * block_size)[:num_tokens].to(DEVICE)
    slots[[2, 7]] = -1
    # key/value as strided views of a fused qkv projection, like the model's output.
    qkv = torch.randn(num_tokens, 4 + 2 * num_kv_heads, head_size, device=DEVICE)
    key, value = qkv[:, 4 : 4 + num_kv_heads], qkv[:, 4 + num_kv_heads :]
    expected = cache.clone()
    write_kv_cache(key, value, expected, slots)
    tk.write_kv_cache(key, value, cache, slots)
    assert torch.equal(cache, expected)


def test_write_kv_cache_casts_to_cache_dtype():
    key = torch.randn(5, 2, 16, device=DEVICE)
    value = torch.randn(5, 2, 16, device=DEVICE)
    slots = torch.tensor([3, 0, -1, 9, 15], device=DEVICE)
    cache = torch.zeros(2, 2, 8, 2, 16, dtype=torch.float16, device=DEVICE)
    expected = cache.clone()
    write_kv_cache(key, value, expected, slots)
    tk.write_kv_cache(key, value, cache, slots)
    assert torch.equal(cache, expected)


def test_registration():
    assert get_attn_impl_cls("triton") is TritonAttentionImpl
    assert default_backend(torch.device("cpu")) == "torch"
    assert default_backend(torch.device("cuda")) == "triton"
