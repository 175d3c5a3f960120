"""Greedy token-exact parity with HF transformers (float32, CPU) on the same weights, per architecture."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk import LLM, SamplingParams
from tests.conftest import ARCHS

PROMPTS = [
    "The quick brown fox",
    "Paris is",
    "def add(a, b):",
    "Once upon a time there was a small engine that served many requests quickly. Once upon a time",
    "A",
    "Numbers: 0 1 2 3 4",
    "The weather is nice today. Tomorrow it may",
    "A language model predicts the next token from the tokens before it, and then",
    "Symbols: !?.,;:",
]
MAX_TOKENS = 20


def hf_greedy(folder: str, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    results = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        results.append(out[0, ids.shape[1] :].tolist())
    return results


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(tiny_model_factory, arch):
    folder = tiny_model_factory(arch)
    llm = LLM(folder, device="cpu")
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    expected = hf_greedy(folder, PROMPTS)
    assert [o.outputs[0].token_ids for o in outputs] == expected
    for output, prompt in zip(outputs, PROMPTS):
        assert output.prompt == prompt
        completion = output.outputs[0]
        assert completion.text == llm.get_tokenizer().decode(completion.token_ids, skip_special_tokens=True)
        assert completion.finish_reason in ("stop", "length")
        assert output.metrics.first_token_time >= output.metrics.arrival_time
        assert output.metrics.finished_time >= output.metrics.first_token_time
