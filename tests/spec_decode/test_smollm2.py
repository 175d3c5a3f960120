"""The real SmolLM2-135M-Instruct (float32 on the CPU): n-gram speculation and a draft model (SmolLM2 cut to its
first layers) give the plain path's greedy tokens, and on a prompt that repeats itself most n-gram drafts are
accepted."""

import pytest
import torch

from brisk import LLM, SamplingParams
from brisk.loader.resolve import DEFAULT_MODEL, resolve_model
from tests.spec_decode.test_draft_model import truncated_copy

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
    "disable_by_batch_size": None,
}  # at every batch size
FUNCTION = (
    "def scale(values, factor):\n    result = []\n    for value in values:\n"
    "        result.append(value * factor)\n    return result\n\n"
)
PROMPTS = [
    FUNCTION * 3 + "def scale(",  # the model goes on repeating the function: n-gram drafts predict it
    "The capital of France is",
]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_outputs():
    return LLM(DEFAULT_MODEL, device="cpu", max_model_len=512).generate(PROMPTS, GREEDY, use_tqdm=False)


def test_greedy_tokens_match_and_repeats_are_accepted(plain_outputs):
    llm = LLM(DEFAULT_MODEL, device="cpu", max_model_len=512, speculative_config=NGRAM)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain_outputs]
    metrics = outputs[0].metrics
    assert metrics.num_accepted_tokens > metrics.num_draft_tokens / 2, vars(metrics)
    assert metrics.mean_acceptance_length > 2


def test_truncated_draft_gives_the_same_tokens(plain_outputs, tmp_path):
    # The first 20 of 30 layers (a cut to 8 accepted almost nothing).
    draft = truncated_copy(str(resolve_model(DEFAULT_MODEL, torch.float32)), tmp_path / "draft", 20)
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "disable_by_batch_size": None}
    llm = LLM(DEFAULT_MODEL, device="cpu", max_model_len=512, speculative_config=config)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in plain_outputs]
    assert sum(o.metrics.num_accepted_tokens for o in outputs) > 0
