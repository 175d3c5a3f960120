"""The scheduler + KV fuzzer with speculation on: random arrivals, aborts, prefix sharing and preemption, and
drafts that are partly right. After every step each request holds exactly the blocks and published hashes the
plain path would hold (``ceil(computed / block_size)`` blocks, ``floor(computed / block_size)`` published, every
hash that of its real tokens), refcounts balance, and the tokens it keeps are the "model's"."""

import random

import pytest

from brisk.engine.kv_cache_manager import KVCacheManager, hash_block_tokens
from brisk.engine.request import Request
from brisk.engine.scheduler import Scheduler, SchedulerOutput
from tests.engine.test_kv_cache_manager import drive, random_scheduler


def model_token(request: Request, index: int) -> int:
    """The deterministic "model": output token ``index`` of a request (a function of its prompt)."""
    return hash((tuple(request.prompt_token_ids), index)) % 8


def propose(rng: random.Random, request: Request) -> list[int]:
    """Drafts whose first few are right and the rest random (so 0..k are accepted)."""
    k, right = rng.randint(0, 4), rng.randint(0, 4)
    n = request.num_output_tokens
    return [model_token(request, n + j) if j < right else rng.randrange(8) for j in range(k)]


def verify(output: SchedulerOutput) -> tuple[list[int | None], list[list[int]]]:
    """What the rejection sampler of a greedy model returns: the drafts up to the first wrong one, then the
    model's token."""
    sampled, accepted = [], []
    for entry in output.scheduled:
        request = entry.request
        drafts = output.spec_token_ids.get(request.request_id, [])
        n = request.num_output_tokens
        good = next((j for j, t in enumerate(drafts) if t != model_token(request, n + j)), len(drafts))
        accepted.append(drafts[:good])
        sampled.append(model_token(request, n + good) if entry.sample else None)
    return sampled, accepted


def check_like_plain_path(kv: KVCacheManager, sched: Scheduler) -> None:
    for request in sched.running:
        rid = request.request_id
        computed = request.num_computed_tokens
        blocks = kv.req_to_blocks[rid]
        assert len(blocks) == -(-computed // kv.block_size), f"{rid} holds blocks past its computed tokens"
        assert kv.req_to_block_ids[rid] == [b.block_id for b in blocks]
        tokens = request.all_token_ids
        parent = None
        for i, block in enumerate(blocks):
            if (i + 1) * kv.block_size > min(computed, len(tokens)):
                break
            parent = hash_block_tokens(parent, tokens[i * kv.block_size : (i + 1) * kv.block_size])
            if kv.enable_caching:
                assert block.block_hash == parent, f"{rid} block {i} not published with its real tokens"
        for block in blocks[computed // kv.block_size :]:
            assert block.block_hash is None, f"{rid} published a block of unverified tokens"


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_speculative_rollback(seed):
    rng = random.Random(seed)
    sched = random_scheduler(rng, enable_caching=seed % 2 == 0)
    kv, max_model_len = sched.kv, sched.max_model_len
    finished: list[Request] = []
    stats = {"drafts": 0, "accepted": 0, "rejected_steps": 0}

    def step():
        for request in sched.running:
            if request.num_computed_tokens == request.num_tokens - 1:
                request.spec_token_ids = propose(rng, request)
        out = sched.schedule()
        assert out.total_num_tokens <= sched.max_num_batched_tokens
        for request_id, drafts in out.spec_token_ids.items():
            request = sched.requests[request_id]
            assert len(drafts) <= sched.max_num_drafts(request)
        sampled, accepted = verify(out)
        for entry, acc in zip(out.scheduled, accepted):
            drafts = out.spec_token_ids.get(entry.request.request_id, [])
            stats["drafts"] += len(drafts)
            stats["accepted"] += len(acc)
            stats["rejected_steps"] += len(acc) < len(drafts)
        finished.extend(sched.update_from_output(out, sampled, accepted))
        check_like_plain_path(kv, sched)

    drive(rng, sched, step)
    assert finished and stats["accepted"] > 0 and stats["rejected_steps"] > 0
    for request in finished:
        limit = min(request.sampling_params.max_tokens, max_model_len - request.num_prompt_tokens)
        assert request.num_output_tokens == limit
        assert request.output_token_ids == [model_token(request, i) for i in range(limit)]


def kv_states_by_length(llm, prompt, params) -> tuple[dict[int, tuple], Request]:
    """Run one request step by step; after each step, keyed by its token count: computed tokens, its blocks'
    hashes and refcounts, the prefix cache's hashes and the blocks in use."""
    engine = llm.engine
    kv = engine.kv_cache_manager
    engine.add_request("r", prompt, params, stream=True)
    request = engine.scheduler.requests["r"]
    states = {}
    while engine.has_unfinished_requests():
        engine.step()
        if not request.is_finished:
            blocks = kv.req_to_blocks["r"]
            states[request.num_tokens] = (
                request.num_computed_tokens,
                [(b.block_hash, b.ref_cnt) for b in blocks],
                sorted(kv.pool.cached),
                kv.pool.num_blocks - kv.num_free_blocks,  # blocks in use (a draft halves the cache)
            )
    return states, request


@pytest.mark.parametrize("num_layers", [2, 1], ids=["own-draft", "truncated-draft"])
def test_engine_kv_state_equals_the_plain_run(tiny_llama, tmp_path, num_layers):
    """The real engine (tiny llama, prefix caching, a cached prefix): after every speculative step, the request's
    KV state (computed tokens, block hashes and refcounts, the prefix cache, blocks in use) equals the plain run's
    at the same token count (the plain run passes through every count). Drafts: the target itself (all
    accepted) or the target cut to one layer (mostly rejected)."""
    from brisk import LLM, SamplingParams
    from tests.engine.test_equivalence import prompts_with_shared_prefix
    from tests.spec_decode.test_draft_model import truncated_copy

    draft = tiny_llama if num_layers == 2 else truncated_copy(tiny_llama, tmp_path / "draft", num_layers)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    runs = []
    for spec in (None, config):
        llm = LLM(tiny_llama, device="cpu", block_size=8, max_model_len=256, speculative_config=spec)
        prompt = prompts_with_shared_prefix(llm.get_tokenizer(), count=2)[1]
        llm.generate([prompt[:40]], params, use_tqdm=False)  # leaves cached blocks behind
        runs.append(kv_states_by_length(llm, prompt, params))
    (plain, _), (speculative, request) = runs
    assert request.num_draft_tokens > 0
    if num_layers == 2:
        assert request.num_accepted_tokens == request.num_draft_tokens and len(speculative) < len(plain) / 3
    else:
        assert request.num_accepted_tokens < request.num_draft_tokens
    for num_tokens, state in speculative.items():
        assert state == plain[num_tokens], num_tokens
