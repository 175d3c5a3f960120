"""Model shapes the benchmarks run on, as config-only folders (random weights with ``--load-format dummy``).

``--model llama-3.1-8b-shape`` (or any name in :data:`NAMED_CONFIGS`) writes the config into a temporary folder:
no weights and no tokenizer are needed, since the offline workloads send token ids.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The recipe of the offline workloads (docs/benchmarks.md): Llama-3.1-8B's config.json, bf16.
LLAMA31_8B_CONFIG: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

# The online workloads (W5, W6): the same shape with the SmolLM2 tokenizer's vocabulary, so
# server and client share a real tokenizer (copy its files in with ``brisk bench write-config --tokenizer``).
LLAMA31_8B_SMOLLM2_VOCAB_CONFIG: dict = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 49152,
}

# A few-MB llama with the 8B's structure (GQA, llama3 rope, untied) and a vocabulary that holds the workloads'
# ids [0, 10000): for CPU smoke runs and tests.
LLAMA_TINY_CONFIG: dict = {
    **LLAMA31_8B_CONFIG,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rope_scaling": {**LLAMA31_8B_CONFIG["rope_scaling"], "original_max_position_embeddings": 512},
    "torch_dtype": "float32",
    "vocab_size": 10240,
}

# The 8B shape as a W4A16 checkpoint (compressed-tensors pack-quantized: symmetric 4-bit weights, a scale per 128
# inputs, as llmcompressor's ``scheme="W4A16"`` saves it): random packed codes and scales with ``--load-format
# dummy``, so INT4 speed can be measured without the real weights.
W4A16_QUANTIZATION_CONFIG: dict = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "format": "pack-quantized",
            "targets": ["Linear"],
            "input_activations": None,
            "weights": {
                "dynamic": False,
                "group_size": 128,
                "num_bits": 4,
                "strategy": "group",
                "symmetric": True,
                "type": "int",
            },
        }
    },
}

# The 8B shape as a block-wise FP8 checkpoint in transformers' FineGrainedFP8 layout (the layout of DeepSeek-V3's and
# Qwen3's FP8 releases): random FP8 values and block scales with ``--load-format dummy``.
FP8_BLOCK_QUANTIZATION_CONFIG: dict = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}

# Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct (the speculative-decoding pair of docs/benchmarks.md), for timing
# speculative steps at their real shapes.
QWEN25_CODER_15B_CONFIG: dict = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "max_position_embeddings": 32768,
    "num_attention_heads": 12,
    "num_hidden_layers": 28,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}
QWEN25_CODER_05B_CONFIG: dict = {
    **QWEN25_CODER_15B_CONFIG,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "tie_word_embeddings": True,
}

NAMED_CONFIGS: dict[str, dict] = {
    "llama-3.1-8b-shape": LLAMA31_8B_CONFIG,
    "llama-3.1-8b-shape-w4a16": {**LLAMA31_8B_CONFIG, "quantization_config": W4A16_QUANTIZATION_CONFIG},
    "llama-3.1-8b-shape-fp8-block": {**LLAMA31_8B_CONFIG, "quantization_config": FP8_BLOCK_QUANTIZATION_CONFIG},
    "llama-3.1-8b-shape-smollm2-vocab": LLAMA31_8B_SMOLLM2_VOCAB_CONFIG,
    "llama-tiny-shape": LLAMA_TINY_CONFIG,
    "qwen2.5-coder-1.5b-shape": QWEN25_CODER_15B_CONFIG,
    "qwen2.5-coder-0.5b-shape": QWEN25_CODER_05B_CONFIG,
}

# The recipe's max_model_len for the named shapes (their configs allow 131072, which the workloads never need).
NAMED_DEFAULT_MAX_MODEL_LEN = 4096

_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def get_config(name: str) -> dict:
    try:
        return copy.deepcopy(NAMED_CONFIGS[name])
    except KeyError:
        raise ValueError(f"Unknown model shape {name!r}; known: {', '.join(NAMED_CONFIGS)}.") from None


def write_config_folder(path: str | Path, name: str, tokenizer: str | Path | None = None, **overrides) -> Path:
    """Write ``NAMED_CONFIGS[name]`` (with ``overrides``) as ``path/config.json``; copy a tokenizer's files in."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**get_config(name), **overrides}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        source = Path(tokenizer)
        copied = [f for f in _TOKENIZER_FILES if (source / f).is_file()]
        if not copied:
            raise FileNotFoundError(f"{source} holds no tokenizer files ({', '.join(_TOKENIZER_FILES)}).")
        for f in copied:
            shutil.copyfile(source / f, folder / f)
    return folder


def is_named(model: str) -> bool:
    return model in NAMED_CONFIGS


@contextlib.contextmanager
def materialize(model: str) -> Iterator[str]:
    """``model`` as a path: a named shape is written into a temporary folder, removed when the block ends."""
    if not is_named(model):
        yield model
        return
    with tempfile.TemporaryDirectory(prefix=f"brisk-bench-{model}-") as tmp:
        write_config_folder(Path(tmp) / model, model)
        yield str(Path(tmp) / model)
