"""The padded layouts the CUDA graphs replay: in a speculative verification step each sequence owns ``1 + k``
rows, the ones its drafts do not fill are padding, and more padding sequences follow; a lone sequence's prefill
fills the first rows of a prefill graph's query length; a mixed step keeps its rows packed, padding rows continue
its last sequence up to a packed graph's token count and empty sequences follow. On real steps, the hidden states
of every real row and the KV cache it leaves equal those of the packed layout the eager path runs (torch attention
backend, float32)."""

import torch

from brisk import LLM, SamplingParams
from brisk.forward_context import set_forward_context
from brisk.worker.cuda_graphs import mixed_graph_tokens, prefill_query_lens
from tests.engine.test_equivalence import prompts_with_shared_prefix

K = 3
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": K,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
    "disable_by_batch_size": None,
}  # at every batch size


def _forward(runner, out, stride, padded, packed_tokens=0):
    """Hidden states of each scheduled request's rows, in order, after filling the buffers in one layout."""
    metadata, row_ends = runner._prepare(out, stride, padded, packed_tokens)
    ids = runner.buffers.on_device.input_ids[: metadata.num_tokens]
    positions = runner.buffers.on_device.positions[: metadata.num_tokens]
    with set_forward_context(metadata):
        hidden = runner.model(ids, positions)
    rows = [range(end - e.num_new_tokens, end) for e, end in zip(out.scheduled, row_ends)]
    return hidden[[r for span in rows for r in span]], metadata


def _check_padded_equals_packed(runner, out, stride: int | None, padded: int, packed_tokens: int = 0) -> None:
    packed, _ = _forward(runner, out, None, 0)
    caches = [c.clone() for c in runner.kv_caches]
    strided, metadata = _forward(runner, out, stride, padded, packed_tokens)
    assert metadata.num_tokens == (packed_tokens or padded * stride) and metadata.num_seqs == padded
    assert packed_tokens or metadata.max_query_len == stride
    torch.testing.assert_close(strided, packed, rtol=1e-5, atol=1e-5)
    for before, after in zip(caches, runner.kv_caches):  # same slots written, none beside them
        torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)


def test_padded_verification_rows_equal_packed_rows(tiny_llama):
    # A small cache (64 blocks of 16 tokens, 512 bytes per token), since each checked step copies it.
    llm = LLM(tiny_llama, device="cpu", speculative_config=NGRAM, kv_cache_memory_bytes=64 * 16 * 512)
    runner = llm.engine.model_runner
    real_execute = runner.execute
    checked = []

    def execute(out, timer):
        if out.spec_token_ids and max(e.num_new_tokens for e in out.scheduled) <= 1 + K:
            _check_padded_equals_packed(runner, out, 1 + K, len(out.scheduled) + 2)
            checked.append([e.num_new_tokens for e in out.scheduled])
        return real_execute(out, timer)

    runner.execute = execute
    prompts = prompts_with_shared_prefix(llm.get_tokenizer())[:4]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    widths = {n for step in checked for n in step}
    assert len(checked) > 3 and 1 + K in widths and min(widths) < 1 + K, checked  # full and short rows both ran


def test_padded_prefill_rows_equal_packed_rows(tiny_llama):
    """Whole prompts and chunks after a prefix-cache hit, each padded to the next prefill graph's length."""
    llm = LLM(tiny_llama, device="cpu", max_num_batched_tokens=32, kv_cache_memory_bytes=64 * 16 * 512)
    runner = llm.engine.model_runner
    budget, max_seqs = llm.engine.max_num_batched_tokens, llm.engine.scheduler.max_num_seqs
    lens = prefill_query_lens(budget, max(budget, max_seqs), llm.engine.max_model_len)  # as the runner captures
    real_execute = runner.execute
    checked = []

    def execute(out, timer):
        (entry, *others) = out.scheduled
        if not others and entry.num_new_tokens > 1:
            stride = next(q for q in lens if q >= entry.num_new_tokens)
            _check_padded_equals_packed(runner, out, stride, 1)
            checked.append((entry.start, entry.num_new_tokens))
        return real_execute(out, timer)

    runner.execute = execute
    for prompt in prompts_with_shared_prefix(llm.get_tokenizer())[:3]:  # one at a time: one sequence per step
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert lens == [16, 32] and any(start > 0 for start, _ in checked), checked  # chunks and cache hits ran
    assert any(n not in lens for _, n in checked), checked  # prompts that leave padding rows


def test_packed_mixed_rows_equal_packed_rows(tiny_llama):
    """Steps mixing prompt chunks, a prefix-cache hit and decodes, padded to the next packed graph's token count
    (a padding sequence, then empty ones up to the buffers' capacity)."""
    llm = LLM(tiny_llama, device="cpu", max_num_batched_tokens=64, max_num_seqs=8, kv_cache_memory_bytes=64 * 16 * 512)
    runner = llm.engine.model_runner
    graph_seqs = llm.engine.scheduler.max_num_seqs + 1  # as the runner's packed graphs: one for the padding
    counts = mixed_graph_tokens(64, 64, llm.engine.max_model_len)
    real_execute = runner.execute
    checked = []

    def execute(out, timer):
        if len(out.scheduled) > 1 and max(e.num_new_tokens for e in out.scheduled) > 1:
            tokens = next(t for t in counts if t >= out.total_num_tokens)
            _check_padded_equals_packed(runner, out, None, graph_seqs, tokens)
            checked.append((len(out.scheduled), out.total_num_tokens, tokens))
        return real_execute(out, timer)

    runner.execute = execute
    prompts = prompts_with_shared_prefix(llm.get_tokenizer())[:5]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert counts == [64] and len(checked) > 2, checked
    assert any(total < tokens for _, total, tokens in checked), checked  # steps that leave padding rows
    assert llm.engine.get_stats().prefix_cache_hits > 0


def test_mixed_graph_token_counts():
    assert mixed_graph_tokens(8192, 8192, 4096) == [64, 128, 192, 256, 384, 512, 768, 1024, 1152, 1280, 1536, 1792,
                                                    2048]  # fmt: skip
    assert mixed_graph_tokens(300, 300, 4096) == [64, 128, 192, 256]  # the buffers cap them
    assert mixed_graph_tokens(8192, 8192, 700) == [64, 128, 192, 256, 384, 512]  # so does the context


def test_prefill_graphs_stop_at_the_first_that_holds_the_budget():
    """Buffers of 256 rows (max_num_seqs) but a 64-token budget: graphs of 128 and 256 rows would never replay;
    a 100-token budget needs the 128-row graph for its full chunks."""
    assert prefill_query_lens(64, 256, 4096) == [16, 32, 64]
    assert prefill_query_lens(100, 256, 4096) == [16, 32, 64, 128]
    assert prefill_query_lens(8192, 8192, 200) == [16, 32, 64, 128]  # the context caps them
