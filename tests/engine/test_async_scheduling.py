"""Async scheduling (step N+1 launched before step N's tokens are read back) changes nothing users can see:
same tokens, stops, logprobs and seeded samples as the synchronous engine, and no KV block outlives its request.
(With n-gram speculation the steps that carry drafts differ between the two, and so do seeded samples; greedy
tokens do not: ``tests/spec_decode``.)"""

import pytest

from brisk import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox",
    "Paris is the capital of France, and Berlin is",
    "def add(a, b):",
    "Once upon a time there was a small engine that served many requests quickly.",
    "A",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
]


@pytest.fixture(scope="module")
def engines(tiny_llama):
    return {mode: LLM(tiny_llama, device="cpu", async_scheduling=mode == "async") for mode in ("sync", "async")}


def completions(llm: LLM, params) -> list[list[tuple]]:
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [[(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs]


def test_async_engine_keeps_a_step_in_flight(engines):
    engine = engines["async"].engine
    assert engine.async_scheduling and not engines["sync"].engine.async_scheduling
    engine.add_request("probe", "The quick brown fox", SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()
    assert engine._in_flight is not None  # the next step was launched before this one was applied
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks


@pytest.mark.parametrize("logprobs", [None, 2], ids=["plain", "logprobs"])
def test_a_step_that_needs_the_last_tokens_runs_while_they_are_emitted(engines, logprobs):
    """Penalties read the token history, so each step waits for the last one's tokens: it is launched once they
    are booked, before step() emits them, and is in flight when step() returns them. A launch that itself reads
    the device back (logprobs) comes after the outputs instead, on the next call."""
    engine = engines["async"].engine
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, repetition_penalty=1.2, logprobs=logprobs)
    engine.add_request("history", "The quick brown fox", params, stream=True)
    before = dict(engine.launch_counts)
    emitted = 0
    while engine.has_unfinished_requests():
        outputs = engine.step()
        emitted += len(outputs)
        if outputs and not outputs[0].finished:  # the next step runs while these outputs go out, or after them
            assert (engine._in_flight is not None) == (logprobs is None)
    assert emitted == 6 and engine.launch_counts["ahead"] == before["ahead"]
    assert engine.launch_counts["waited"] - before["waited"] == 6
    engine.step()  # the step launched with the last token's booking found nothing to run
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks


@pytest.mark.parametrize(
    "params",
    [
        # Mixed lengths: requests end on different steps, some by EOS.
        [SamplingParams(temperature=0, max_tokens=m) for m in (1, 2, 3, 17, 40, 64)],
        SamplingParams(temperature=0, max_tokens=40, stop=[" the", "e"]),
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[5, 17, 42, 99]),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=20, stop_token_ids=[5, 17, 42, 99]),
        SamplingParams(temperature=0.9, top_p=0.9, max_tokens=24, seed=7, n=2),
        SamplingParams(temperature=0.8, max_tokens=24, repetition_penalty=1.3, frequency_penalty=0.5, seed=3),
        # Penalties read the token history: each step is launched once the last one's tokens are booked, and a
        # stop string is found after that launch.
        SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.2, stop=[" the", "e"]),
    ],
    ids=["lengths", "stop-strings", "stop-ids", "min-tokens", "seeded-n2", "penalties", "penalties-stop-strings"],
)
def test_same_outputs_as_sync(engines, params):
    assert completions(engines["async"], params) == completions(engines["sync"], params)
    engine = engines["async"].engine
    engine.step()  # the step launched after the last stop, whose requests are all gone
    assert engine._in_flight is None
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks


def test_same_logprobs_as_sync(engines):
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=3, prompt_logprobs=2)
    sync, fast = (engines[m].generate(PROMPTS, params, use_tqdm=False) for m in ("sync", "async"))
    for a, b in zip(sync, fast):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for pa, pb in zip(a.outputs[0].logprobs + a.prompt_logprobs[1:], b.outputs[0].logprobs + b.prompt_logprobs[1:]):
            assert pa.keys() == pb.keys()
            assert all(abs(pa[t].logprob - pb[t].logprob) < 1e-5 for t in pa)


def test_abort_with_a_step_in_flight_frees_everything(engines):
    engine = engines["async"].engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"abort-{i}", prompt, params)
    for _ in range(3):
        engine.step()
    assert engine._in_flight is not None
    engine.abort_request([f"abort-{i}" for i in range(0, len(PROMPTS), 2)])
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
    assert sorted(finished) == [f"abort-{i}" for i in range(1, len(PROMPTS), 2)]
    assert all(len(o.outputs[0].token_ids) == 50 for o in finished.values())
    engine.step()  # apply the last launched step, whose requests are all gone
    assert engine._in_flight is None
    assert engine.kv_cache_manager.num_free_blocks == engine.kv_cache_manager.pool.num_blocks
