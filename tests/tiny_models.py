"""Tiny random-weight models written to disk with transformers, plus a small byte-level BPE tokenizer with a
ChatML chat template: real HF folders (config.json, safetensors, tokenizer files) that load in well under a
second, so every test can compare brisk with transformers on the same weights."""

from __future__ import annotations

from pathlib import Path

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "A language model predicts the next token from the tokens before it.",
    "Once upon a time there was a small engine that served many requests quickly.",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: !?.,;:-_()[]{}<>",
    "The weather is nice today. Tomorrow it may rain in the morning and clear up in the evening.",
] * 20


def build_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def _config(arch: str, vocab_size: int, eos_id: int, num_kv_heads: int = 2):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=1024,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        initializer_range=0.2,
    )
    if arch == "llama":
        return LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        )
    if arch == "mistral":  # a short sliding window, to check that brisk refuses what it would get wrong
        return MistralConfig(**common, sliding_window=48, tie_word_embeddings=False)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=True)
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    raise ValueError(arch)


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, num_kv_heads: int = 2) -> Path:
    """Write a tiny ``arch`` model (llama, mistral, qwen2, qwen3; 4 attention heads, ``num_kv_heads`` KV heads) with
    a tokenizer into ``folder`` and return it."""
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    config = _config(arch, len(tokenizer), tokenizer.eos_token_id, num_kv_heads)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


REMOTE_CONFIG_CODE = '''from transformers import LlamaConfig


class ShortLlamaConfig(LlamaConfig):
    model_type = "shortllama"
'''


def make_remote_code_copy(model: str | Path, folder: Path, comment: str = "") -> Path:
    """A copy of the Llama folder ``model`` whose config class is its own Python (``auto_map``), which
    transformers runs only with ``trust_remote_code``; another ``comment`` in the code makes transformers import
    it as another module."""
    import json
    import shutil

    shutil.copytree(model, folder)
    (folder / "configuration_shortllama.py").write_text(REMOTE_CONFIG_CODE + (f"# {comment}\n" if comment else ""))
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "shortllama"
    config["auto_map"] = {"AutoConfig": "configuration_shortllama.ShortLlamaConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
