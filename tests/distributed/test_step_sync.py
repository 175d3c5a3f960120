"""Step messages: what a worker's ``RequestMirror`` rebuilds from them (through pickle, as over the pipe) is the
driver's ``SchedulerOutput``, row for row, over the scheduler+KV fuzzer's random runs: arrivals with shared
prefixes (prefix-cache hits), chunked prompts, preemption, aborts, finishes, and async scheduling's overlap."""

from __future__ import annotations

import pickle
import random

import pytest

from brisk.engine.request import Request, RequestStatus
from brisk.engine.scheduler import ScheduledRequest, SchedulerOutput
from brisk.executor.step_sync import RequestMirror, StepEncoder
from brisk.sampling_params import SamplingParams
from tests.engine.test_kv_cache_manager import drive, fake_tokens, random_scheduler

VOCAB_SIZE = 384  # the width of grammar bitmasks (none in these runs)


def assert_mirrored(schedule, mirrored) -> None:
    assert len(mirrored.scheduled) == len(schedule.scheduled)
    assert mirrored.total_num_tokens == schedule.total_num_tokens
    for (request, num_new, start, sample), got in zip(schedule.scheduled, mirrored.scheduled):
        assert (got.request.request_id, got.num_new_tokens, got.start, got.sample) == (
            request.request_id, num_new, start, sample,
        )  # fmt: skip
        assert got.request.all_token_ids == request.all_token_ids
        assert got.request.num_pending_tokens == request.num_pending_tokens
        assert mirrored.block_tables[request.request_id] == schedule.block_tables[request.request_id]
    assert set(mirrored.block_tables) == {entry.request.request_id for entry in schedule.scheduled}


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("seed", range(3))
def test_mirror_rebuilds_every_schedule(seed, overlap):
    rng = random.Random(100 + seed)
    sched = random_scheduler(rng, enable_caching=True)
    encoder, mirror = StepEncoder(VOCAB_SIZE), RequestMirror()
    in_flight = None

    def step():
        nonlocal in_flight
        out = sched.schedule()
        message = pickle.loads(pickle.dumps(encoder.encode(out)))
        assert_mirrored(out, mirror.apply(message))
        previous, in_flight = (in_flight, out) if overlap else (out, None)
        if previous is not None:
            sched.update_from_output(previous, fake_tokens(rng, previous))

    drive(rng, sched, step, idle=lambda: in_flight is None)
    sched.schedule()  # nothing left: the next message ends the last requests on the workers too
    mirror.apply(encoder.encode(sched.schedule()))
    assert len(mirror) == 0


@pytest.mark.parametrize("seed", range(2))
def test_mirror_follows_speculative_rollbacks(seed):
    """With drafts (partly right, as in the rollback fuzzer), a rejected draft's block is freed and the table
    shrinks into a new list: the workers' tables must follow, drafts included, and be new lists too (the model
    runner follows tables by identity and copies only what was appended)."""
    from tests.spec_decode.test_rollback_fuzz import propose, verify

    rng = random.Random(200 + seed)
    sched = random_scheduler(rng, enable_caching=True)
    encoder, mirror = StepEncoder(VOCAB_SIZE), RequestMirror()
    tables_seen: dict[str, list[int]] = {}
    rollbacks = 0

    def step():
        nonlocal rollbacks
        for request in sched.running:
            if request.num_computed_tokens == request.num_tokens - 1:
                request.spec_token_ids = propose(rng, request)
        out = sched.schedule()
        mirrored = mirror.apply(pickle.loads(pickle.dumps(encoder.encode(out))))
        assert_mirrored(out, mirrored)
        assert mirrored.spec_token_ids == out.spec_token_ids
        for rid, table in mirrored.block_tables.items():
            previous = tables_seen.get(rid)
            if previous is not None and previous is table and len(out.block_tables[rid]) < len(previous):
                raise AssertionError(f"{rid}: a shorter table kept its list")
            tables_seen[rid] = table
        sampled, accepted = verify(out)
        before = {rid: len(table) for rid, table in out.block_tables.items()}
        sched.update_from_output(out, sampled, accepted)
        rollbacks += sum(len(sched.kv.req_to_block_ids.get(rid, ())) < n for rid, n in before.items())

    drive(rng, sched, step)
    assert rollbacks > 0  # tables did shrink


def test_a_new_request_under_a_finished_ones_id_is_sent_whole():
    """The server takes request ids from clients (vLLM's ``request_id``), so a finished request's id can come back
    at once, alone in the same single row: the workers must get the new request, not reuse the old one's row."""
    encoder, mirror = StepEncoder(VOCAB_SIZE), RequestMirror()
    params = SamplingParams(max_tokens=4)
    first, second = Request("a", [1, 2, 3], params, frozenset()), Request("a", [7, 8], params, frozenset())
    step = SchedulerOutput([ScheduledRequest(first, 3, 0, True)], {"a": [0]}, 3)
    assert_mirrored(step, mirror.apply(pickle.loads(pickle.dumps(encoder.encode(step)))))
    first.status = RequestStatus.FINISHED_STOPPED
    step = SchedulerOutput([ScheduledRequest(second, 2, 0, True)], {"a": [5]}, 2)
    assert_mirrored(step, mirror.apply(pickle.loads(pickle.dumps(encoder.encode(step)))))
