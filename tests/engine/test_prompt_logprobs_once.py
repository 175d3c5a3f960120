"""A request with ``n`` sequences and prompt logprobs (the server's ``echo`` + ``logprobs``) computes its prompt
once: the first sequence computes it with its logprobs, the others read its KV blocks from the prefix cache. So
one such request stays a prompt's worth of work, and a small request sent beside it is not held up for ``n``
prefills."""

from __future__ import annotations

from dataclasses import replace

import pytest

from brisk.config import EngineArgs
from brisk.engine.engine import LLMEngine
from brisk.sampling_params import SamplingParams

PROMPT = [(7 * i + 3) % 300 + 1 for i in range(200)]
BUDGET = 256


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return LLMEngine(
        EngineArgs(model=tiny_llama, device="cpu", kv_cache_memory_bytes=16 << 20, max_num_batched_tokens=BUDGET)
    )


def test_n_sequences_share_one_prompt_computation(engine):
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    engine.add_request("one", PROMPT, params, stream=False)
    alone = {}
    while engine.has_unfinished_requests():
        alone.update({o.request_id: o for o in engine.step()})
    hits_before = engine.get_stats().prefix_cache_hits

    engine.add_request("many", [t + 1 for t in PROMPT], replace(params, n=8), stream=False)
    steps = 0
    many = {}
    while engine.has_unfinished_requests():
        many.update({o.request_id: o for o in engine.step()})
        steps += 1
    out = many["many"]
    assert len(out.outputs) == 8 and all(len(c.token_ids) == 2 for c in out.outputs)
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(PROMPT)
    # The seven other sequences found the prompt's full blocks in the cache (12 of 16 tokens each, at least).
    block = engine.args.block_size
    assert engine.get_stats().prefix_cache_hits - hits_before >= 7 * (len(PROMPT) // block - 1) * block
    # Prompt once (one step of 256 tokens holds it and the other sequences' tails), then one decode step.
    assert steps <= 3, steps


def test_prompt_logprobs_equal_with_n(engine):
    base = dict(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    outputs = {}
    engine.add_request("n1", PROMPT, SamplingParams(**base), stream=False)
    engine.add_request("n4", PROMPT, SamplingParams(**base, n=4), stream=False)
    while engine.has_unfinished_requests():
        outputs.update({o.request_id: o for o in engine.step()})
    one, four = outputs["n1"].prompt_logprobs, outputs["n4"].prompt_logprobs
    assert len(one) == len(four) == len(PROMPT)
    for a, b in zip(one[1:], four[1:], strict=True):
        assert a.keys() == b.keys()
        for token, lp in a.items():
            assert b[token].logprob == pytest.approx(lp.logprob, abs=1e-4)


def test_a_small_request_beside_is_not_held_up(engine):
    """The n=16 echo request first, a 2-token request right after: the small one finishes within the steps
    it needs alone plus one (it used to wait for 16 prefills of the prompt, one per step at this budget)."""
    big = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=1, n=16)
    engine.add_request("big", [t + 2 for t in PROMPT], big)
    engine.add_request("small", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        if any(o.request_id == "small" and o.finished for o in engine.step()):
            break
    assert steps <= 3, steps  # alone: 2 steps (prefill + one decode)
    while engine.has_unfinished_requests():
        engine.step()
