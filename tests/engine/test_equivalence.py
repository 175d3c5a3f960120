"""Every scheduling optimization gives the same greedy tokens as the plain path, with async scheduling (step N+1
scheduled before step N's tokens are read back) off and on."""

import pytest

from brisk import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
SHARED = "Once upon a time there was a small engine that served many requests quickly. " * 3


def prompts_with_shared_prefix(tokenizer, count: int = 8) -> list[list[int]]:
    prefix = tokenizer.encode(SHARED)
    return [prefix + tokenizer.encode(f" Request number {i} asks about {'the fox ' * (i % 3)}") for i in range(count)]


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=False)
    prompts = prompts_with_shared_prefix(llm.get_tokenizer())
    return prompts, token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))


ASYNC = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@ASYNC
def test_prefix_caching_gives_same_tokens_and_hits(tiny_llama, baseline, async_scheduling):
    prompts, expected = baseline
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=True, async_scheduling=async_scheduling)
    first = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    assert first[0].num_cached_tokens == 0
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    shared_blocks = len(llm.get_tokenizer().encode(SHARED)) // 16
    assert all(o.num_cached_tokens >= shared_blocks * 16 for o in outputs)
    stats = llm.engine.get_stats()
    assert stats.prefix_cache_hits >= len(prompts) * shared_blocks * 16
    assert stats.prefix_cache_queries >= stats.prefix_cache_hits


@ASYNC
def test_chunked_prefill_tiny_budget(tiny_llama, baseline, async_scheduling):
    prompts, expected = baseline
    llm = LLM(
        tiny_llama,
        device="cpu",
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    assert token_ids(llm.generate(prompts, GREEDY, use_tqdm=False)) == expected


@ASYNC
def test_forced_preemption(tiny_llama, baseline, async_scheduling):
    prompts, expected = baseline
    # 2 layers x 2 kv heads x 16 dims x 2 (k, v) x 4 bytes = 512 bytes per token; 12 blocks of 16 tokens.
    llm = LLM(
        tiny_llama,
        device="cpu",
        kv_cache_memory_bytes=12 * 16 * 512,
        max_model_len=160,
        async_scheduling=async_scheduling,
    )
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert llm.engine.get_stats().num_preemptions > 0
    assert llm.engine.kv_cache_manager.num_free_blocks == 12


@ASYNC
def test_n_greedy_completions_are_identical(tiny_llama, baseline, async_scheduling):
    prompts, expected = baseline
    llm = LLM(tiny_llama, device="cpu", async_scheduling=async_scheduling)
    params = SamplingParams(n=3, temperature=0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate(prompts[:2], params, use_tqdm=False)
    for output, want in zip(outputs, expected):
        assert [c.index for c in output.outputs] == [0, 1, 2]
        assert all(c.token_ids == want for c in output.outputs)


@ASYNC
def test_batch_of_one_equals_batch_of_32(tiny_llama, async_scheduling):
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=False, async_scheduling=async_scheduling)
    tok = llm.get_tokenizer()
    prompts = [tok.encode(f"Numbers: {' '.join(str(j) for j in range(i % 11))} and the fox {i}") for i in range(32)]
    batched = token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))
    singles = [token_ids(llm.generate([p], GREEDY, use_tqdm=False))[0] for p in prompts[:6]]
    assert batched[:6] == singles


def test_triton_backend_in_the_interpreter_gives_the_same_tokens(tiny_llama, baseline):
    """The Triton kernels through the engine (on CPU in Triton's interpreter): prefill over cached prefixes, the
    rotary embedding applied in the KV-cache writer, split decode. Three prompts keep the interpreter quick."""
    pytest.importorskip("triton")
    prompts, expected = baseline
    llm = LLM(tiny_llama, device="cpu", attention_backend="triton", enable_prefix_caching=True)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outputs = llm.generate(prompts[:3], params, use_tqdm=False)
    assert token_ids(outputs) == [ids[:6] for ids in expected[:3]]
    assert outputs[2].num_cached_tokens > 0


def _logprob_table(positions) -> list[dict[int, float] | None]:
    return [None if p is None else {t: round(lp.logprob, 4) for t, lp in p.items()} for p in positions]


def test_prompt_logprobs_on_a_prefix_cache_hit(tiny_llama):
    """Cached blocks carry no logits: a request asking for prompt logprobs computes its whole prompt, so it gets
    every position's logprobs even when its prefix is cached (the run before filled the cache)."""
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    plain = LLM(tiny_llama, device="cpu", enable_prefix_caching=False)
    prompt = plain.get_tokenizer().encode(SHARED)
    expected = _logprob_table(plain.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs)
    assert len(expected) == len(prompt) > 32
    cached = LLM(tiny_llama, device="cpu", enable_prefix_caching=True)
    for _ in range(2):
        out = cached.generate([prompt], params, use_tqdm=False)[0]
        assert _logprob_table(out.prompt_logprobs) == expected
    # A request without prompt logprobs still hits the cache that the runs above filled.
    assert cached.generate([prompt], GREEDY, use_tqdm=False)[0].num_cached_tokens >= 32


def test_prefix_cache_counts_each_admitted_request_once(tiny_llama):
    """A request that waits for KV blocks looks its prefix up again each step; it is counted once, when admitted."""
    probe = LLM(tiny_llama, device="cpu")
    per_block = probe.engine.model_runner.kv_cache_bytes_per_block()
    llm = LLM(tiny_llama, device="cpu", kv_cache_memory_bytes=14 * per_block, max_model_len=176)
    tokenizer = llm.get_tokenizer()
    # Two prompts sharing 8 blocks run together (11 blocks); the third (9 blocks) waits until they finish.
    prompts = prompts_with_shared_prefix(tokenizer, count=2)
    prompts.append(tokenizer.encode("A different story. " * 24)[: len(prompts[0])])
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.engine.get_stats()
    assert stats.num_preemptions == 0 and outputs[1].num_cached_tokens >= 64
    assert stats.prefix_cache_queries == sum(len(p) for p in prompts)
    assert stats.prefix_cache_hits == sum(o.num_cached_tokens for o in outputs)


def test_cache_salt_shares_cached_prefixes_only_within_a_salt(tiny_llama):
    """vLLM's prompt dicts with a ``cache_salt``: a prefix cached under one salt (or none) is a hit only for
    prompts of the same salt, and salted prompts still give the plain greedy tokens; an empty salt is refused."""
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=True)
    prompt = llm.get_tokenizer().encode(SHARED)
    expected = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids  # unsalted, now cached

    def run(salt: str) -> tuple[int, list[int]]:
        out = llm.generate({"prompt_token_ids": prompt, "cache_salt": salt}, GREEDY, use_tqdm=False)[0]
        return out.num_cached_tokens, out.outputs[0].token_ids

    assert run("a") == (0, expected) and run("b") == (0, expected)
    cached, tokens = run("a")
    assert cached >= 32 and tokens == expected
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate({"prompt": SHARED, "cache_salt": ""}, GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
