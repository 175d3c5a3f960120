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
