"""vLLM 0.26's SamplingParams fields: every one is accepted at its default; values asking for what brisk lacks are
a ValueError naming the field; those brisk implements (logprob_token_ids, output_kind, skip_reading_prefix_cache,
repetition_detection) are checked end to end on the tiny random-weight Llama (CPU)."""

import asyncio
import copy
import dataclasses
import pickle

import pytest
import torch
from transformers import AutoModelForCausalLM

from brisk import LLM, SamplingParams
from brisk.config import EngineArgs
from brisk.engine.async_engine import AsyncLLM
from brisk.outputs import CompletionOutput, DeltaOutputs, Logprob, RequestMetrics, RequestOutput
from brisk.sampling_params import RepetitionDetectionParams, RequestOutputKind

# vLLM 0.26.0's SamplingParams constructor (vllm/sampling_params.py, a msgspec Struct), every public field at its
# default. Left out: the private fields the engine sets (_eos_token_id, _all_stop_token_ids,
# _bad_words_token_ids), which user code does not pass.
VLLM_026_DEFAULTS = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "seed": None,
    "stop": None,
    "stop_token_ids": None,
    "ignore_eos": False,
    "max_tokens": 16,
    "min_tokens": 0,
    "logprobs": None,
    "prompt_logprobs": None,
    "logprob_token_ids": None,
    "flat_logprobs": False,
    "detokenize": True,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
    "output_kind": RequestOutputKind.CUMULATIVE,
    "skip_clone": False,
    "output_text_buffer_length": 0,
    "structured_outputs": None,
    "logit_bias": None,
    "allowed_token_ids": None,
    "extra_args": None,
    "routed_experts_prompt_start": 0,
    "bad_words": None,
    "skip_reading_prefix_cache": None,
    "thinking_token_budget": None,
    "repetition_detection": None,
}
GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, device="cpu")


def test_every_vllm_field_at_its_default():
    params = SamplingParams(**VLLM_026_DEFAULTS)
    assert params == SamplingParams()
    for name, value in VLLM_026_DEFAULTS.items():
        if value is not None and name not in ("stop", "stop_token_ids"):
            assert getattr(params, name) == value, name


def test_vllm_values_that_ask_for_nothing_or_what_brisk_does():
    params = SamplingParams(
        thinking_token_budget=-1,  # vLLM's "unlimited"
        extra_args={},
        logprob_token_ids=[],
        spaces_between_special_tokens=False,  # fast tokenizers add no spaces either way (as the server)
        skip_clone=True,
        skip_reading_prefix_cache=False,
        routed_experts_prompt_start=7,
        output_kind="final_only",
        repetition_detection=RepetitionDetectionParams(),  # max_pattern_size 0: off
        flat_logprobs=False,
    )
    assert params.thinking_token_budget is None and params.logprob_token_ids is None
    assert params.output_kind is RequestOutputKind.FINAL_ONLY
    assert not params.repetition_detection.enabled
    assert SamplingParams(stop=["abcd", "x"]).output_text_buffer_length == 3  # as vLLM sets it
    assert SamplingParams(stop=["abcd"], include_stop_str_in_output=True).output_text_buffer_length == 0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"flat_logprobs": True}, "flat_logprobs"),
        ({"thinking_token_budget": 0}, "thinking_token_budget"),
        ({"thinking_token_budget": 256}, "thinking_token_budget"),
        ({"thinking_token_budget": -1.0}, "thinking_token_budget"),
        ({"extra_args": {"my_processor": 1}}, "extra_args"),
        ({"logprob_token_ids": [-1]}, "logprob_token_ids"),
        ({"logprob_token_ids": list(range(129))}, "logprob_token_ids"),
        ({"logprob_token_ids": [1, 2], "logprobs": 3}, "logprob_token_ids"),
        ({"logprob_token_ids": "5"}, "logprob_token_ids"),
        ({"output_kind": "sideways"}, "output_kind"),
        ({"skip_reading_prefix_cache": "yes"}, "skip_reading_prefix_cache"),
        ({"spaces_between_special_tokens": None}, "spaces_between_special_tokens"),
        ({"skip_clone": 1}, "skip_clone"),
        ({"routed_experts_prompt_start": -1}, "routed_experts_prompt_start"),
        ({"output_text_buffer_length": -1}, "output_text_buffer_length"),
        ({"repetition_detection": 3}, "repetition_detection"),
    ],
)
def test_refused_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field} "):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_pattern_size": 3, "min_count": 1}, "min_count"),
        ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}, "min_pattern_size"),
        ({"max_pattern_size": -1}, "max_pattern_size"),
    ],
)
def test_bad_repetition_detection(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(repetition_detection=kwargs)


def test_repetition_patterns():
    def repeats(tokens, **kwargs):
        return RepetitionDetectionParams(**kwargs).repeats(tokens)

    assert repeats([9, 1, 2, 3, 1, 2, 3], max_pattern_size=3, min_count=2)
    assert not repeats([9, 1, 2, 3, 1, 2, 4], max_pattern_size=3, min_count=2)
    assert not repeats([1, 2, 3, 1, 2, 3], max_pattern_size=2, min_count=2)  # the pattern is longer than allowed
    assert not repeats([1, 2, 1, 2], max_pattern_size=2, min_count=3)  # seen twice, three asked
    assert repeats([5, 5, 5, 5], min_pattern_size=2, max_pattern_size=2, min_count=2)
    assert not repeats([5, 5, 5, 5, 5], min_pattern_size=3, max_pattern_size=3, min_count=2)
    assert not repeats([5] * 50, max_pattern_size=0, min_count=0)  # off


def test_copies_and_pickles_keep_the_new_fields():
    params = SamplingParams(
        logprob_token_ids=[3, 4],
        output_kind=RequestOutputKind.DELTA,
        repetition_detection={"max_pattern_size": 4, "min_count": 3},
        stop=["ab"],
        skip_reading_prefix_cache=True,
    )
    for copied in (params.clone(), copy.deepcopy(params), pickle.loads(pickle.dumps(params))):
        assert copied == params and copied is not params
        assert copied.stop is not params.stop
    assert dataclasses.replace(params, n=2).repetition_detection == params.repetition_detection
    shallow = dataclasses.replace(params, skip_clone=True)
    assert shallow.clone().stop is shallow.stop  # skip_clone: a shallow copy, as vLLM's clone()


def _reference_logprobs(model_dir, prompt_ids, completion_ids):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0]
    return logits.log_softmax(-1)[len(prompt_ids) - 1 : -1]


def _assert_listed(completion, ref, listed):
    assert len(completion.logprobs) == len(completion.token_ids)
    for token, position, expected in zip(completion.token_ids, completion.logprobs, ref):
        assert set(position) == {token, *listed}
        for t, lp in position.items():
            assert abs(lp.logprob - expected[t].item()) < 1e-4
            # its rank in the whole vocabulary: 1 + the tokens more likely (those within rounding either way)
            more_likely = (expected > expected[t] + 1e-4).sum().item()
            not_less_likely = (expected >= expected[t] - 1e-4).sum().item()  # itself included
            assert more_likely + 1 <= lp.rank <= not_less_likely
    assert completion.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(completion.token_ids, completion.logprobs))
    )


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_logprob_token_ids_match_the_models_log_softmax(llm, tiny_llama, sampled):
    listed = [5, 17, 200, 301]
    sampling = dict(temperature=0.9, seed=3) if sampled else dict(temperature=0)
    params = [
        SamplingParams(max_tokens=6, ignore_eos=True, logprob_token_ids=listed, **sampling),
        SamplingParams(max_tokens=6, ignore_eos=True, logprob_token_ids=listed, logprobs=4, **sampling),
        SamplingParams(max_tokens=6, ignore_eos=True, logprobs=2, **sampling),  # a top-k row in the same batch
    ]
    outs = llm.generate(["The quick brown fox"] * 3, params, use_tqdm=False)
    for out in outs[:2]:
        completion = out.outputs[0]
        _assert_listed(completion, _reference_logprobs(tiny_llama, out.prompt_token_ids, completion.token_ids), listed)
    top = outs[2].outputs[0]
    ref = _reference_logprobs(tiny_llama, outs[2].prompt_token_ids, top.token_ids)
    for token, position, expected in zip(top.token_ids, top.logprobs, ref):
        assert set(expected.topk(2).indices.tolist()) <= set(position) <= {token, *expected.topk(2).indices.tolist()}


def test_logprob_token_ids_under_speculative_decoding(tiny_llama):
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    spec = LLM(tiny_llama, device="cpu", speculative_config={**ngram, "disable_by_batch_size": None})
    params = SamplingParams(max_tokens=24, logprob_token_ids=[5, 17], **GREEDY)
    out = spec.generate("the the the the the the", params, use_tqdm=False)[0]
    assert out.metrics.num_draft_tokens > 0  # drafts were verified: the rejection sampler gave these logprobs
    completion = out.outputs[0]
    _assert_listed(completion, _reference_logprobs(tiny_llama, out.prompt_token_ids, completion.token_ids), [5, 17])


def test_logprob_token_ids_outside_the_vocabulary(llm):
    with pytest.raises(ValueError, match="logprob_token_ids"):
        llm.generate("a", SamplingParams(max_tokens=2, logprob_token_ids=[10**6]), use_tqdm=False)


def _run_engine(engine, request_id, prompt, params):
    engine.add_request(request_id, prompt, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs += engine.step()
    return outputs


def _joined(deltas, n):
    """Per completion index: the deltas' text, token ids and logprobs joined."""
    texts, ids, lps = [""] * n, [[] for _ in range(n)], [[] for _ in range(n)]
    for out in deltas:
        for c in out.outputs:
            texts[c.index] += c.text
            ids[c.index] += c.token_ids
            lps[c.index] += c.logprobs
    return texts, ids, lps


@pytest.mark.parametrize("n", [1, 2])
def test_output_kind_on_engine_steps(llm, n):
    engine, prompt = llm.engine, "Paris is"
    base = dict(n=n, max_tokens=8, ignore_eos=True, temperature=0.8, seed=11, logprobs=1, prompt_logprobs=1)
    cumulative = _run_engine(engine, "c", prompt, SamplingParams(**base))
    final = cumulative[-1]
    assert len(cumulative) > 1 and final.finished and not any(o.finished for o in cumulative[:-1])
    for earlier, later in zip(cumulative, cumulative[1:]):
        for a, b in zip(earlier.outputs, later.outputs):
            assert b.token_ids[: len(a.token_ids)] == a.token_ids and b.text.startswith(a.text)

    (only,) = _run_engine(engine, "f", prompt, SamplingParams(**base, output_kind=RequestOutputKind.FINAL_ONLY))
    assert only.finished and only.outputs == final.outputs and only.prompt_logprobs == final.prompt_logprobs

    deltas = _run_engine(engine, "d", prompt, SamplingParams(**base, output_kind=RequestOutputKind.DELTA))
    assert len(deltas) == len(cumulative) and deltas[-1].finished
    assert all(c.token_ids for out in deltas for c in out.outputs)  # each holds only completions that changed
    texts, ids, lps = _joined(deltas, n)
    assert texts == [c.text for c in final.outputs]
    assert ids == [c.token_ids for c in final.outputs]
    assert lps == [c.logprobs for c in final.outputs]
    assert [c.cumulative_logprob for c in deltas[-1].outputs] == [
        final.outputs[c.index].cumulative_logprob for c in deltas[-1].outputs
    ]
    assert deltas[0].prompt_logprobs == final.prompt_logprobs and all(o.prompt_logprobs == [] for o in deltas[1:])

    # LLM.generate returns the whole final output whatever the kind (as vLLM's LLM does)
    for kind in RequestOutputKind:
        (out,) = llm.generate(prompt, SamplingParams(**base, output_kind=kind), use_tqdm=False)
        assert out.outputs == final.outputs


def test_output_kind_on_async_streams(tiny_llama, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = EngineArgs(model=tiny_llama, device="cpu", kv_cache_memory_bytes=16 << 20)
    base = dict(max_tokens=12, logprobs=1, **GREEDY)

    async def collect(engine, kind, request_id, slow=False):
        outputs = []
        async for out in engine.generate("Paris is", SamplingParams(**base, output_kind=kind), request_id):
            outputs.append(out)
            if slow:
                await asyncio.sleep(0.05)  # fall behind: the stream merges what it skips
        return outputs

    async def main():
        engine = AsyncLLM.from_engine_args(args)
        try:
            cumulative = await collect(engine, RequestOutputKind.CUMULATIVE, "c")
            final_only = await collect(engine, RequestOutputKind.FINAL_ONLY, "f")
            delta = await collect(engine, RequestOutputKind.DELTA, "d")
            slow_delta = await collect(engine, RequestOutputKind.DELTA, "s", slow=True)
        finally:
            await engine.shutdown()
        return cumulative, final_only, delta, slow_delta

    loop = asyncio.new_event_loop()
    try:
        cumulative, final_only, delta, slow_delta = loop.run_until_complete(asyncio.wait_for(main(), 120))
    finally:
        loop.close()
    final = cumulative[-1].outputs[0]
    assert len(final.token_ids) == 12 and len(cumulative) > 1
    assert len(final_only) == 1 and final_only[0].outputs[0].token_ids == final.token_ids
    assert final_only[0].outputs[0].text == final.text
    for deltas in (delta, slow_delta):
        assert deltas[-1].finished and not any(o.finished for o in deltas[:-1])
        texts, ids, lps = _joined(deltas, 1)
        assert (texts[0], ids[0]) == (final.text, final.token_ids)
        assert len(lps[0]) == len(final.logprobs)
        for got, want in zip(lps[0], final.logprobs):
            assert got.keys() == want.keys()
            assert all(abs(got[t].logprob - want[t].logprob) < 1e-5 for t in want)
    assert len(delta) > 1


def test_delta_outputs_cut_shared_logprobs_at_the_tokens():
    """A stream's cumulative outputs share one logprobs list that the reader thread extends: a delta must stop at
    the output's own tokens."""
    shared = [{1: Logprob(-0.1, 1)}, {2: Logprob(-0.2, 1)}]

    def output(ids, finished=False):
        completion = CompletionOutput(0, "x" * len(ids), ids, -1.0, shared, "length" if finished else None)
        return RequestOutput("r", "p", [0], [completion], finished, RequestMetrics(0.0))

    deltas = DeltaOutputs()
    first = output([1, 2])
    shared.append({3: Logprob(-0.3, 1)})  # the next step arrived before the consumer read the first
    assert deltas.delta(first).outputs[0].logprobs == shared[:2]
    last = deltas.delta(output([1, 2, 3], finished=True)).outputs[0]
    assert (last.text, last.token_ids, last.logprobs) == ("x", [3], shared[2:])
    assert deltas.delta(output([1, 2, 3], finished=True)).outputs == []  # nothing new


def test_skip_reading_prefix_cache(llm):
    prompt = "The quick brown fox jumps over the lazy dog, then runs far away into the woods at night. " * 2
    params = SamplingParams(max_tokens=6, **GREEDY)
    first = llm.generate(prompt, params, use_tqdm=False)[0]
    cached = llm.generate(prompt, params, use_tqdm=False)[0]
    assert cached.num_cached_tokens >= 16  # the prompt's full blocks come from the prefix cache
    queries = llm.engine.get_stats().prefix_cache_queries
    skipped = llm.generate(prompt, dataclasses.replace(params, skip_reading_prefix_cache=True), use_tqdm=False)[0]
    assert skipped.num_cached_tokens == 0 and llm.engine.get_stats().prefix_cache_queries == queries
    assert first.outputs[0].token_ids == cached.outputs[0].token_ids == skipped.outputs[0].token_ids
    # its blocks are still published: the next request reads them
    assert llm.generate(prompt, params, use_tqdm=False)[0].num_cached_tokens == cached.num_cached_tokens


def test_repetition_detection_ends_the_completion(llm):
    """Only one token allowed: the output repeats it, so a pattern of 2 seen 3 times is there at token 6."""
    token = 50
    base = dict(max_tokens=20, allowed_token_ids=[token], **GREEDY)
    detect = {"min_pattern_size": 2, "max_pattern_size": 2, "min_count": 3}
    outs = llm.generate(
        ["A", "A", "A", "A"],
        [
            SamplingParams(**base, repetition_detection=detect),
            SamplingParams(**base, repetition_detection=detect, min_tokens=9),  # not checked before min_tokens
            SamplingParams(**{**base, "max_tokens": 5}, repetition_detection=detect),  # ends by length first
            SamplingParams(**base, repetition_detection={"max_pattern_size": 0}),  # off
        ],
        use_tqdm=False,
    )
    got = [(len(o.outputs[0].token_ids), o.outputs[0].finish_reason, o.outputs[0].stop_reason) for o in outs]
    assert got == [
        (6, "repetition", "repetition_detected"),
        (9, "repetition", "repetition_detected"),
        (5, "length", None),
        (20, "length", None),
    ]
    assert all(o.outputs[0].token_ids == [token] * len(o.outputs[0].token_ids) for o in outs)
    kv = llm.engine.kv_cache_manager
    assert kv.num_free_blocks == kv.pool.num_blocks
