"""The startup warm-up (run on GPUs to compile kernels before the first user request) leaves no trace: no
requests, cached prefixes, KV blocks or counters, and the same tokens afterwards, seeded or not."""

import pytest

from brisk import LLM, SamplingParams

PROMPTS = ["The quick brown fox", "Paris is the capital of France, and Berlin is", "A"]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=12), SamplingParams(temperature=0.9, max_tokens=12)]


def generate(llm: LLM) -> list[list[list[int]]]:
    return [[o.outputs[0].token_ids for o in llm.generate(PROMPTS, p, use_tqdm=False)] for p in PARAMS]


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_warm_up_leaves_no_trace(tiny_llama, async_scheduling):
    expected = generate(LLM(tiny_llama, device="cpu", async_scheduling=async_scheduling))
    llm = LLM(tiny_llama, device="cpu", async_scheduling=async_scheduling)
    engine = llm.engine
    engine.warm_up()
    stats = engine.get_stats()
    assert (stats.num_running, stats.num_waiting, stats.prefix_cache_queries, stats.prefix_cache_hits) == (0, 0, 0, 0)
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks
    assert not engine.has_unfinished_requests() and engine._in_flight is None
    # Greedy tokens, and unseeded samples drawn from the engine seed's streams, are those of a fresh engine.
    assert generate(llm) == expected


def test_warm_up_refuses_a_busy_engine(tiny_llama):
    engine = LLM(tiny_llama, device="cpu").engine
    engine.add_request("busy", "The quick brown fox", SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="idle engine"):
        engine.warm_up()
