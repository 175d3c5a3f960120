"""KV cache manager fuzz: thousands of random operations with the invariants checked after each one."""

import random

import pytest

from brisk.engine.kv_cache_manager import KVCacheManager
from brisk.engine.request import Request, RequestStatus
from brisk.engine.scheduler import Scheduler
from brisk.sampling_params import SamplingParams


def check_invariants(kv: KVCacheManager) -> None:
    pool = kv.pool
    refs = {b.block_id: 0 for b in pool.blocks}
    for blocks in kv.req_to_blocks.values():
        for block in blocks:
            refs[block.block_id] += 1
    for block in pool.blocks:
        assert block.ref_cnt == refs[block.block_id], f"block {block.block_id} refcount"
        assert (block.block_id in pool.free_queue) == (block.ref_cnt == 0), f"block {block.block_id} free xor used"
    for block_hash, block in pool.cached.items():
        assert block.block_hash == block_hash


def make_request(rng: random.Random, i: int, vocab: int = 8) -> Request:
    # A tiny vocabulary and shared stems make prefix hits common.
    stem = [1, 2, 3, 4] * rng.randint(0, 12)
    prompt = stem + [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
    params = SamplingParams(max_tokens=rng.randint(1, 40), ignore_eos=True)
    return Request(f"r{i}", prompt, params, frozenset())


def fake_tokens(rng: random.Random, out) -> list[int | None]:
    return [rng.randrange(8) if entry.sample else None for entry in out.scheduled]


def random_scheduler(rng: random.Random, enable_caching: bool) -> Scheduler:
    """A scheduler over a small KV cache of random shape and a random token budget."""
    num_blocks = rng.choice([24, 40, 64])
    block_size = rng.choice([4, 8, 16])
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_caching=enable_caching)
    # As at engine startup: one max_model_len sequence always fits the whole cache.
    max_model_len = min(200, num_blocks * block_size)
    return Scheduler(kv, max_num_batched_tokens=rng.choice([16, 64, 256]), max_num_seqs=8, max_model_len=max_model_len)


def drive(rng: random.Random, sched: Scheduler, step, idle=lambda: True) -> None:
    """1,500 random operations (arrivals with shared stems, aborts, ``step()``s) with the KV invariants checked after
    each; then drain (``idle``: no step in flight either), after which every block must be free."""
    kv = sched.kv
    next_id = 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.15:
            request = make_request(rng, next_id)
            if request.num_tokens < sched.max_model_len:
                sched.add_request(request)
            next_id += 1
        elif op < 0.2 and sched.requests:
            victim = rng.choice(list(sched.requests))
            sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
        else:
            step()
        check_invariants(kv)
    for _ in range(5000):
        if not sched.has_unfinished_requests() and idle():
            break
        step()
        check_invariants(kv)
    assert not sched.has_unfinished_requests()
    assert kv.num_free_blocks == kv.pool.num_blocks
    assert not kv.req_to_blocks


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("seed", range(4))
def test_fuzz_scheduler_and_kv_manager(seed, overlap):
    """With ``overlap`` each step is scheduled before the previous one's tokens are applied (async scheduling)."""
    rng = random.Random(seed)
    sched = random_scheduler(rng, enable_caching=seed % 2 == 0)
    kv, max_model_len = sched.kv, sched.max_model_len
    finished: list[Request] = []
    in_flight = None

    def step():
        nonlocal in_flight
        out = sched.schedule()
        total = sum(entry.num_new_tokens for entry in out.scheduled)
        assert total == out.total_num_tokens <= sched.max_num_batched_tokens
        assert len(out.scheduled) <= sched.max_num_seqs
        for request, num_new, start, sample in out.scheduled:
            blocks = kv.req_to_blocks[request.request_id]
            assert request.num_computed_tokens == start + num_new
            assert len(blocks) * kv.block_size >= start + num_new
            # A sampling row computes every known and in-flight token; a prompt chunk stops short of them.
            assert (
                start + num_new == request.num_tokens_with_pending - 1
                if sample
                else start + num_new < request.num_tokens
            )
            assert request.num_pending_tokens <= (2 if overlap else 1)
        previous, in_flight = (in_flight, out) if overlap else (out, None)
        if previous is not None:
            finished.extend(sched.update_from_output(previous, fake_tokens(rng, previous)))

    drive(rng, sched, step, idle=lambda: in_flight is None)
    # Length-finished requests stopped exactly at their limit: no token of a step scheduled past it was kept.
    assert finished
    for request in finished:
        assert request.status == RequestStatus.FINISHED_LENGTH
        assert request.num_output_tokens == request.sampling_params.max_tokens or request.num_tokens == max_model_len


def test_prefix_hit_shares_blocks_and_lru_eviction():
    kv = KVCacheManager(num_blocks=6, block_size=4, enable_caching=True)
    a = Request("a", list(range(9)), SamplingParams(), frozenset())
    assert kv.get_computed_blocks(a) == ([], 0)
    assert kv.allocate_slots(a, 9)
    b = Request("b", list(range(9)) + [42], SamplingParams(), frozenset())
    hits, num = kv.get_computed_blocks(b)
    assert num == 8 and [x.block_id for x in hits] == kv.get_block_ids("a")[:2]
    assert kv.allocate_slots(b, 2, hits)
    assert [blk.ref_cnt for blk in hits] == [2, 2]
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 6
    # The cached prefix survives freeing, until new allocations evict it (least recently freed first).
    c = Request("c", list(range(9)), SamplingParams(), frozenset())
    assert kv.get_computed_blocks(c)[1] == 8
    assert kv.allocate_slots(Request("d", [7] * 24, SamplingParams(), frozenset()), 24)
    assert kv.get_computed_blocks(c)[1] == 0
