"""Speculative decoding with the n-gram proposer gives exactly the plain path's greedy tokens (and text, finish
reasons, logprobs), through prefix-cache hits, chunked prefill, forced preemption, ``n = 3``, stop strings and
async scheduling. The tiny random model accepts few drafts, so most steps exercise the rollback."""

import pytest

from brisk import LLM, SamplingParams
from tests.engine.test_equivalence import prompts_with_shared_prefix, token_ids

# Speculation at every batch size (the default stops at 2 running requests, DEFAULT_DISABLE_BY_BATCH_SIZE).
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
    "disable_by_batch_size": None,
}
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def baseline(tiny_llama):
    llm = LLM(tiny_llama, device="cpu", enable_prefix_caching=False)
    prompts = prompts_with_shared_prefix(llm.get_tokenizer())
    return prompts, token_ids(llm.generate(prompts, GREEDY, use_tqdm=False))


def assert_speculated(outputs) -> None:
    """Drafts were verified, some accepted and some rejected (both paths ran)."""
    proposed = sum(o.metrics.num_draft_tokens for o in outputs)
    accepted = sum(o.metrics.num_accepted_tokens for o in outputs)
    assert 0 < accepted < proposed


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {"enable_prefix_caching": False},
        {"enable_prefix_caching": True},
        {"max_num_batched_tokens": 16, "enable_prefix_caching": False},
        # 12 blocks of 16 tokens (512 bytes per token): requests preempt each other.
        {"kv_cache_memory_bytes": 12 * 16 * 512, "max_model_len": 160},
        {"async_scheduling": True},
    ],
    ids=["plain", "prefix-cache", "chunked-prefill", "preemption", "async"],
)
def test_same_greedy_tokens(tiny_llama, baseline, engine_kwargs):
    prompts, expected = baseline
    llm = LLM(tiny_llama, device="cpu", speculative_config=NGRAM, **engine_kwargs)
    if engine_kwargs.get("enable_prefix_caching"):
        llm.generate(prompts[:1], GREEDY, use_tqdm=False)  # so that the batch hits the cached prefix
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert_speculated(outputs)
    kv = llm.engine.kv_cache_manager
    assert kv.num_free_blocks == kv.pool.num_blocks and not kv.req_to_blocks
    if "kv_cache_memory_bytes" in engine_kwargs:
        assert llm.engine.get_stats().num_preemptions > 0
    if engine_kwargs.get("enable_prefix_caching"):
        assert all(o.num_cached_tokens > 0 for o in outputs)


def test_n_3_and_load_aware_switching(tiny_llama, baseline):
    """With the default ``disable_by_batch_size`` (2, none given) and async scheduling, steps switch between
    pipelined plain decoding (seven completions running, then three) and speculation (the last one alone)."""
    prompts, expected = baseline
    config = {key: value for key, value in NGRAM.items() if key != "disable_by_batch_size"}
    llm = LLM(tiny_llama, device="cpu", speculative_config=config, async_scheduling=True)
    engine, decisions = llm.engine, []  # (running requests, whether the step gets drafts)
    speculating = engine._speculating
    engine._speculating = lambda: decisions.append((len(engine.scheduler.running), speculating())) or decisions[-1][1]
    params = [SamplingParams(n=n, temperature=0, max_tokens=m, ignore_eos=True) for n, m in ((3, 8), (3, 12), (1, 24))]
    outputs = llm.generate(prompts[:1] * 3, params, use_tqdm=False)
    for output, p in zip(outputs, params):
        assert [c.token_ids for c in output.outputs] == [expected[0][: p.max_tokens]] * p.n
    assert not any(drafts for running, drafts in decisions if running >= 2)
    assert any(drafts for running, drafts in decisions if running == 1)


def test_ngram_steps_without_a_match_are_launched_ahead(tiny_llama, baseline):
    """With async scheduling, the n-gram proposer's lookup runs one step behind: where it finds no earlier
    occurrence for the tokens known so far, the next step is launched before this one's tokens are read back (a
    plain decode, as without speculation); where it finds one, the next step waits for them and proposes. One request at
    a time (batch 1, where speculation is on) does both here, with the plain path's tokens."""
    prompts, expected = baseline
    engine = LLM(tiny_llama, device="cpu", speculative_config=NGRAM, async_scheduling=True).engine
    drafts = 0
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, GREEDY, stream=False)
        outputs = []
        while engine.has_unfinished_requests() or engine._in_flight is not None:
            outputs += engine.step()
        assert [o.outputs[0].token_ids for o in outputs] == [expected[i]]
        drafts += outputs[0].metrics.num_draft_tokens
    counts = engine.launch_counts
    print(f"steps launched ahead {counts['ahead']}, waited {counts['waited']}; drafts {drafts}")
    assert counts["ahead"] > 0 and counts["waited"] > len(prompts) and drafts > 0  # (each prompt starts idle)


def test_stops_logprobs_and_min_tokens_match(tiny_llama, baseline):
    """Tokens emitted after a stop (EOS, stop token, stop string, max_tokens) in the same verified step are
    dropped, and logprobs cover the emitted tokens only."""
    prompts, expected = baseline
    plain = LLM(tiny_llama, device="cpu")
    spec = LLM(tiny_llama, device="cpu", speculative_config=NGRAM)
    text = plain.get_tokenizer().decode(expected[0][:20])
    params = [
        SamplingParams(temperature=0, max_tokens=24, logprobs=2),
        SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[expected[1][9]], min_tokens=3),
        SamplingParams(temperature=0, max_tokens=24, stop=[text[-6:-2]], logprobs=0),
        SamplingParams(temperature=0, max_tokens=11, ignore_eos=True, repetition_penalty=1.3),
    ]
    chosen = prompts[:4]
    a = plain.generate(chosen, params, use_tqdm=False)
    b = spec.generate(chosen, params, use_tqdm=False)
    for x, y in zip(a, b):
        cx, cy = x.outputs[0], y.outputs[0]
        assert (cy.token_ids, cy.text, cy.finish_reason, cy.stop_reason) == (
            cx.token_ids,
            cx.text,
            cx.finish_reason,
            cx.stop_reason,
        )
        if cx.logprobs is not None:
            assert len(cy.logprobs) == len(cy.token_ids)
            for px, py in zip(cx.logprobs, cy.logprobs):
                assert px.keys() == py.keys()
                assert all(abs(px[t].logprob - py[t].logprob) < 1e-4 for t in px)
            assert cy.cumulative_logprob == pytest.approx(cx.cumulative_logprob, abs=1e-3)
    assert_speculated(b)


def test_seeded_sampling_is_reproducible(tiny_llama, baseline):
    """Sampled verification draws from each seeded request's own generator: the same seeds give the same tokens
    run to run, whatever else is in the batch."""
    prompts, _ = baseline
    llm = LLM(tiny_llama, device="cpu", speculative_config=NGRAM)
    params = SamplingParams(n=2, temperature=0.8, top_p=0.9, presence_penalty=0.5, seed=7, max_tokens=24)
    first = llm.generate(prompts[:2], params, use_tqdm=False)
    again = llm.generate(prompts[:2] + prompts[4:6], params, use_tqdm=False)[:2]
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in again]
    assert sum(o.metrics.num_draft_tokens for o in first) > 0


@pytest.mark.parametrize(("tp", "pp", "disable_by_batch_size"), [(2, 1, None), (1, 2, None), (1, 2, 7)])
def test_ngram_speculation_on_two_ranks(tiny_llama, baseline, tp, pp, disable_by_batch_size):
    """The proposer runs in the engine's process; each step's message carries the drafts, the sampling rank
    verifies them and sends back the accepted ones, and a rollback's shorter block table reaches the workers.
    With pipeline stages, speculative steps go one at a time. With ``disable_by_batch_size`` the engine pipelines
    the batch while it is large, and drains the pipeline to speculate once requests end (each has its own
    ``max_tokens`` here, so its greedy tokens are a prefix of the plain run's)."""
    prompts, expected = baseline
    config, params = NGRAM, GREEDY
    if disable_by_batch_size is not None:
        config = {**NGRAM, "disable_by_batch_size": disable_by_batch_size}
        params = [SamplingParams(temperature=0, max_tokens=4 + 2 * i, ignore_eos=True) for i in range(len(prompts))]
        expected = [tokens[: 4 + 2 * i] for i, tokens in enumerate(expected)]
    llm = LLM(tiny_llama, device="cpu", speculative_config=config, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    in_flight = []  # batches already in flight each time one is launched
    launch = llm.engine._launch
    llm.engine._launch = lambda: in_flight.append(len(llm.engine._pipeline)) or launch()
    try:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        llm.engine.model_runner.shutdown()
    assert token_ids(outputs) == expected
    if disable_by_batch_size is None:
        assert_speculated(outputs)
        assert max(in_flight) == 0  # every step speculates: one at a time
    else:  # the tiny model accepts few drafts: these few speculative steps reject theirs
        assert sum(o.metrics.num_draft_tokens for o in outputs) > 0
        assert max(in_flight) == pp - 1


def test_constrained_rows_beside_drafts_keep_their_constraints(tiny_llama, baseline):
    """A request with token constraints (logit bias, allowed tokens, bad words) gets no drafts, but it may share a
    step with requests that verify theirs; the rejection sampler then samples its row, which must apply the
    constraints as the plain sampler does."""
    prompts, _ = baseline
    allowed = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, allowed_token_ids=[5, 6])
    biased = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logit_bias={7: 100.0})
    params = [GREEDY, allowed, biased, GREEDY]
    expected = token_ids(LLM(tiny_llama, device="cpu").generate(prompts[:4], params, use_tqdm=False))
    outputs = LLM(tiny_llama, device="cpu", speculative_config=NGRAM).generate(prompts[:4], params, use_tqdm=False)
    assert token_ids(outputs) == expected
    assert set(expected[1]) <= {5, 6} and set(expected[2]) == {7}
    assert outputs[1].metrics.num_draft_tokens == outputs[2].metrics.num_draft_tokens == 0
    assert outputs[0].metrics.num_draft_tokens + outputs[3].metrics.num_draft_tokens > 0  # shared steps
