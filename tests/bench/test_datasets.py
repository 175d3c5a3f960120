"""The benchmark prompts are the peers recipe's, token for token (pinned fingerprints)."""

import numpy as np
import pytest

from brisk.bench import configs, datasets
from brisk.bench.random_dataset import random_requests


def test_pinned_fingerprints():
    assert datasets.FINGERPRINTS == {"W1": "c64d310445788388", "W2": "4b412bb5cc3c82e3"}
    w1, w2 = datasets.build_workload("W1"), datasets.build_workload("W2")
    assert w1.fingerprint == w1.fingerprint_expected == "c64d310445788388"
    assert w2.fingerprint == w2.fingerprint_expected == "4b412bb5cc3c82e3"


def test_w1_recipe_shape():
    w1 = datasets.build_workload("W1")
    assert w1.num_requests == 256 and w1.temperature == 0.6
    assert (w1.input_tokens, w1.output_tokens) == (datasets.W1_INPUT_TOKENS, datasets.W1_OUTPUT_TOKENS)
    assert all(100 <= len(p) <= 1024 for p in w1.prompts) and all(100 <= n <= 1024 for n in w1.output_lens)
    assert all(0 <= t < 10000 for p in w1.prompts for t in p)


def test_w2_recipe_shape():
    w2 = datasets.build_workload("W2")
    assert w2.temperature == 0.0
    assert {len(p) for p in w2.prompts} == {512} and set(w2.output_lens) == {128} and w2.num_requests == 256


def test_subsets_and_custom_lengths_are_prefixes_of_the_recipe():
    full1, full2 = datasets.build_workload("W1"), datasets.build_workload("W2")
    w1 = datasets.build_workload("W1", num_prompts=4, output_len=4)
    assert w1.prompts == full1.prompts[:4] and w1.output_lens == [4] * 4 and w1.fingerprint_expected is None
    w2 = datasets.build_workload("W2", num_prompts=3)
    assert w2.prompts == full2.prompts[:3] and w2.name == "W2-custom"
    assert len(datasets.build_workload("W2", num_prompts=2, input_len=16).prompts[1]) == 16
    with pytest.raises(ValueError):
        datasets.build_workload("W1", input_len=10)
    with pytest.raises(ValueError):
        datasets.build_workload("W3")


def test_w3_prompts():
    runs, runs_1tok = datasets.latency_prompts()
    assert len(runs) == 3 and len(runs_1tok) == 3
    assert all(len(batch) == 1 and len(batch[0]) == 128 for batch in runs + runs_1tok)
    rng = np.random.default_rng(2)  # the recipe: one draw of 128 per run, full runs first
    expected = [rng.integers(0, 10000, 128).tolist() for _ in range(6)]
    assert [b[0] for b in runs + runs_1tok] == expected
    batched, _ = datasets.latency_prompts(num_iters=2, batch_size=4, input_len=32)
    assert [len(b) for b in batched] == [4, 4] and {len(p) for b in batched for p in b} == {32}


def test_w4_prompts():
    batches = datasets.long_context_prompts()
    assert [len(b) for b in batches] == [1, 8] and {len(p) for b in batches for p in b} == {32000}
    rng = np.random.default_rng(3)  # the recipe: one draw of 32,000 per prompt, batch 1 then batch 8
    assert [p for b in batches for p in b] == [rng.integers(0, 10000, 32000).tolist() for _ in range(9)]


def test_warmup_prompts():
    assert [len(p) for p in datasets.warmup_prompts()] == [16, 64, 200, 700]


def test_named_configs(tmp_path):
    folder = configs.write_config_folder(tmp_path / "m", "llama-3.1-8b-shape")
    cfg = __import__("json").loads((folder / "config.json").read_text())
    assert cfg["hidden_size"] == 4096 and cfg["num_hidden_layers"] == 32 and cfg["vocab_size"] == 128256
    assert cfg["num_key_value_heads"] == 8 and cfg["rope_scaling"]["rope_type"] == "llama3"
    assert cfg["tie_word_embeddings"] is False
    assert configs.get_config("llama-3.1-8b-shape-smollm2-vocab")["vocab_size"] == 49152
    with pytest.raises(ValueError):
        configs.get_config("nope")


def test_random_dataset_token_ids():
    reqs = random_requests(5, input_len=20, output_len=7, prefix_len=6, seed=0, vocab_size=300)
    assert [r.prompt_len for r in reqs] == [26] * 5 and [r.output_len for r in reqs] == [7] * 5
    assert all(r.prompt[:6] == reqs[0].prompt[:6] for r in reqs)  # the shared prefix
    assert len({tuple(r.prompt[6:]) for r in reqs}) == 5
    assert all(0 <= t < 300 for r in reqs for t in r.prompt)
    assert reqs == random_requests(5, input_len=20, output_len=7, prefix_len=6, seed=0, vocab_size=300)


def test_random_dataset_text(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    reqs = random_requests(4, input_len=40, output_len=5, seed=1, tokenizer=tok)
    for r in reqs:
        assert isinstance(r.prompt, str)
        assert len(tok.encode(r.prompt, add_special_tokens=False)) == r.prompt_len
        assert abs(r.prompt_len - (40 - tok.num_special_tokens_to_add())) <= 2
