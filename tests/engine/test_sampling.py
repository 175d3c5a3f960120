"""Sampling parameters: seeds, stops, lengths and logprobs, checked against transformers where it applies."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from brisk import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(tiny_llama, device="cpu")


def test_seeded_sampling_is_independent_of_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate(["The quick brown fox"], params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.8, max_tokens=10, ignore_eos=True) for _ in range(5)]
    batch = llm.generate(
        ["Paris is"] * 2 + ["The quick brown fox"] + ["A"] * 3,
        others[:2] + [params] + others[2:],
        use_tqdm=False,
    )
    assert batch[2].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=16, seed=99, ignore_eos=True)
    assert llm.generate(["The quick brown fox"], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_seeded_n_gives_distinct_reproducible_samples(llm):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=7, ignore_eos=True)
    first = [c.token_ids for c in llm.generate("Paris is", params, use_tqdm=False)[0].outputs]
    second = [c.token_ids for c in llm.generate("Paris is", params, use_tqdm=False)[0].outputs]
    assert first == second
    assert len({tuple(t) for t in first}) == 3


def test_stop_string_cuts_text(llm):
    base = llm.generate(
        "The quick brown fox", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    assert len(base.text) > 6
    stop = base.text[3:6]
    cut = llm.generate(
        "The quick brown fox",
        SamplingParams(temperature=0, max_tokens=24, stop=[stop], ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert cut.text == base.text[: base.text.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert stop not in cut.text
    # The last token allowed completes the stop string: the same cut, and it stopped (not "length").
    last = SamplingParams(temperature=0, max_tokens=len(cut.token_ids), stop=[stop], ignore_eos=True)
    at_limit = llm.generate("The quick brown fox", last, use_tqdm=False)[0].outputs[0]
    assert (at_limit.text, at_limit.finish_reason, at_limit.stop_reason) == (cut.text, "stop", stop)


def test_stop_token_ids_and_max_tokens(llm):
    base = llm.generate("Paris is", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)[
        0
    ].outputs[0]
    assert len(base.token_ids) == 10 and base.finish_reason == "length"
    stop_id = base.token_ids[4]
    first = base.token_ids.index(stop_id)
    out = llm.generate(
        "Paris is",
        SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_id], ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.token_ids == base.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id


def test_eos_min_tokens_and_ignore_eos(tiny_llama):
    llm = LLM(tiny_llama, device="cpu")
    first = llm.generate("A", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    greedy_first = first[0].outputs[0].token_ids[0]
    llm.engine.eos_token_ids = frozenset({greedy_first})  # make the model's favourite first token its EOS
    stops = llm.generate("A", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert stops.token_ids == [greedy_first]
    assert stops.finish_reason == "stop" and stops.stop_reason is None
    ignored = llm.generate("A", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert len(ignored[0].outputs[0].token_ids) == 8 and ignored[0].outputs[0].finish_reason == "length"
    held = llm.generate("A", SamplingParams(temperature=0, max_tokens=8, min_tokens=5), use_tqdm=False)
    tokens = held[0].outputs[0].token_ids
    assert len(tokens) >= 5 and greedy_first not in tokens[:5]


def test_logprobs_match_transformers(llm, tiny_llama):
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2, ignore_eos=True)
    out = llm.generate("The quick brown fox", params, use_tqdm=False)[0]
    completion = out.outputs[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    ids = torch.tensor([out.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        ref = model(ids).logits[0].log_softmax(-1)
    n_prompt = len(out.prompt_token_ids)
    assert len(completion.logprobs) == len(completion.token_ids)
    for i, (token, position) in enumerate(zip(completion.token_ids, completion.logprobs)):
        expected = ref[n_prompt - 1 + i]
        assert abs(position[token].logprob - expected[token].item()) < 1e-4
        assert position[token].rank == 1  # greedy picks the top token
        assert len(position) <= 4 and len(position) >= 3
        top = expected.topk(3).indices.tolist()
        assert set(top) <= set(position)
    assert completion.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(completion.token_ids, completion.logprobs))
    )
    assert out.prompt_logprobs[0] is None
    assert len(out.prompt_logprobs) == n_prompt
    for pos in range(1, n_prompt):
        token = out.prompt_token_ids[pos]
        assert abs(out.prompt_logprobs[pos][token].logprob - ref[pos - 1][token].item()) < 1e-4


def test_penalties_change_greedy_output(llm):
    plain = (
        llm.generate("the the the the", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[
            0
        ]
        .outputs[0]
        .token_ids
    )
    penalized = (
        llm.generate(
            "the the the the",
            SamplingParams(
                temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=5.0, frequency_penalty=2.0
            ),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    assert plain != penalized
    assert len(set(penalized)) >= len(set(plain))


def test_top_p_below_float32_keeps_the_top_token(llm):
    """A top_p that rounds to 0 in float32 keeps the most likely token alone: the greedy tokens."""
    prompts = ["The quick brown fox", "Paris is"]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    tiny = SamplingParams(temperature=1.0, top_p=1e-300, max_tokens=8, ignore_eos=True, seed=5)
    outputs = [llm.generate(prompts, p, use_tqdm=False) for p in (greedy, tiny)]
    assert [o.outputs[0].token_ids for o in outputs[0]] == [o.outputs[0].token_ids for o in outputs[1]]


def test_top_k_keeps_every_token_tied_with_the_kth():
    """Ties at the k-th logit all survive (bf16 logits tie often): which one a sort puts first is arbitrary."""
    from brisk.worker.sampler import _filter

    logits = torch.full((1, 40), -5.0)
    logits[0, [4, 9, 17]] = 3.0
    logits[0, [21, 22, 30]] = 1.0
    kept = {
        k: set(
            torch.nonzero(_filter(logits.clone(), [SamplingParams(top_k=k)], logits.device)[0] > -1e30)
            .flatten()
            .tolist()
        )
        for k in (1, 3, 4, 6)
    }
    assert kept == {1: {4, 9, 17}, 3: {4, 9, 17}, 4: {4, 9, 17, 21, 22, 30}, 6: {4, 9, 17, 21, 22, 30}}


def test_prompt_logprobs_are_computed_in_slices(llm, monkeypatch):
    """Prompt logprobs go through the LM head a slice of positions at a time (a whole chunk at once would hold a
    float32 log-softmax of chunk x vocabulary); slices of 5 give the tokens and ranks of one pass, and the values
    to float32 rounding (a one-row slice takes another matmul kernel)."""
    import brisk.worker.model_runner as model_runner

    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3)
    prompt = "The quick brown fox jumps over the lazy dog, then runs far away into the woods at night."
    whole = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    monkeypatch.setattr(model_runner, "PROMPT_LOGPROBS_ROWS", 5)
    sliced = llm.generate([prompt], params, use_tqdm=False)[0].prompt_logprobs
    assert len(whole) > 12 and len(sliced) == len(whole) and sliced[0] is None is whole[0]
    for got, want in zip(sliced[1:], whole[1:]):
        assert {t: lp.rank for t, lp in got.items()} == {t: lp.rank for t, lp in want.items()}
        assert all(abs(got[t].logprob - want[t].logprob) < 1e-5 for t in want)
