"""The padded layouts the CUDA graphs replay: in a speculative verification step each sequence owns ``1 + k``
rows, the ones its drafts do not fill are padding, and more padding sequences follow; a lone sequence's prefill
fills the first rows of a prefill graph's query length. On real steps, the hidden states of every real row and
the KV cache it leaves equal those of the packed layout the eager path runs (torch attention backend, float32)."""

import torch

from brisk import LLM, SamplingParams
from brisk.forward_context import set_forward_context
from brisk.worker.cuda_graphs import prefill_query_lens
from tests.engine.test_equivalence import prompts_with_shared_prefix

K = 3
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _forward(runner, out, stride, padded):
    """Hidden states of each scheduled request's rows, in order, after filling the buffers in one layout."""
    metadata, row_ends = runner._prepare(out, stride, padded)
    ids = runner.buffers.on_device.input_ids[: metadata.num_tokens]
    positions = runner.buffers.on_device.positions[: metadata.num_tokens]
    with set_forward_context(metadata):
        hidden = runner.model(ids, positions)
    rows = [range(end - e.num_new_tokens, end) for e, end in zip(out.scheduled, row_ends)]
    return hidden[[r for span in rows for r in span]], metadata


def _check_padded_equals_packed(runner, out, stride: int, padded: int) -> None:
    packed, _ = _forward(runner, out, None, 0)
    caches = [c.clone() for c in runner.kv_caches]
    strided, metadata = _forward(runner, out, stride, padded)
    assert metadata.num_tokens == padded * stride and metadata.max_query_len == stride
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


def test_prefill_graphs_stop_at_the_first_that_holds_the_budget():
    """Buffers of 256 rows (max_num_seqs) but a 64-token budget: graphs of 128 and 256 rows would never replay;
    a 100-token budget needs the 128-row graph for its full chunks."""
    assert prefill_query_lens(64, 256, 4096) == [16, 32, 64]
    assert prefill_query_lens(100, 256, 4096) == [16, 32, 64, 128]
    assert prefill_query_lens(8192, 8192, 200) == [16, 32, 64, 128]  # the context caps them
