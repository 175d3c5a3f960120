"""The copying weights of ``brisk bench``'s speculative-step benchmarks: a model made to copy repeats its input,
so speculation on it accepts every draft."""

import pytest

from brisk import LLM, SamplingParams
from brisk.bench.configs import write_config_folder
from brisk.bench.copying_weights import make_copying

PROMPT = [17, 300, 42, 9, 1000, 5]


@pytest.fixture(scope="module")
def shape(tmp_path_factory):
    return str(write_config_folder(tmp_path_factory.mktemp("copying"), "llama-tiny-shape"))


def _generate(llm: LLM, max_tokens: int = 24):
    make_copying(llm.engine.model_runner.model)
    if llm.engine.drafter is not None:
        make_copying(llm.engine.drafter.runner.model)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    return llm.generate([PROMPT], params, use_tqdm=False)[0]


def test_a_copying_model_repeats_its_last_token(shape):
    llm = LLM(shape, load_format="dummy", device="cpu", max_model_len=256)
    before = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert set(before[0].outputs[0].token_ids) != {PROMPT[-1]}  # random weights say something else
    assert _generate(llm).outputs[0].token_ids == [PROMPT[-1]] * 24


@pytest.mark.parametrize(
    "spec",
    [
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1},
        {"method": "draft_model", "model": "SHAPE", "num_speculative_tokens": 4},
    ],
    ids=["ngram", "draft_model"],
)
def test_speculation_on_a_copying_model_accepts_every_draft(shape, spec):
    spec = {**spec, "model": shape} if spec["method"] == "draft_model" else spec
    llm = LLM(shape, load_format="dummy", device="cpu", max_model_len=256, speculative_config=spec)
    out = _generate(llm)
    assert out.outputs[0].token_ids == [PROMPT[-1]] * 24
    assert out.metrics.num_draft_tokens >= 12
    assert out.metrics.num_accepted_tokens == out.metrics.num_draft_tokens
