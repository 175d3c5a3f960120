"""brisk's own reading of config.json (``brisk.json_config``) against transformers' config classes: every field
brisk reads, and every quantity it derives from them, must come out the same, for each family's defaults and
for configs written as the field writes them (old and new transformers, windowed Qwen, llama3 rope)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig

from brisk.bench.configs import NAMED_CONFIGS
from brisk.config import ModelConfig, read_hf_config, resolve_dtype
from brisk.json_config import FAMILY_DEFAULTS, JsonConfig
from brisk.layers.rotary import rope_parameters
from brisk.models.registry import get_model_class
from tests.tiny_models import make_tiny_model

# The attributes brisk's engine, loader, models and layers read, beyond the derived quantities below.
READ_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "hidden_act",
    "rms_norm_eps",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "bos_token_id",
    "eos_token_id",
    "architectures",
    "quantization_config",
)

QWEN25_05B = {  # Qwen2.5-0.5B-Instruct's config.json: a window size that use_sliding_window turns off
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
CONFIGS = {
    **{f"{family} defaults": {"model_type": family} for family in FAMILY_DEFAULTS},
    **{name: config for name, config in NAMED_CONFIGS.items()},
    "qwen2.5-0.5b": QWEN25_05B,
    "qwen2 windowed from layer 2": {**QWEN25_05B, **SMALL, "use_sliding_window": True, "max_window_layers": 2},
    "qwen3 without head_dim": {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], **SMALL},
    "mistral 7b v0.1": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096},
    "mistral v0.3": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": None},
    "mistral with use_sliding_window false": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "sliding_window": 64,
        "use_sliding_window": False,
    },
    "llama3 rope without its original length": {
        **NAMED_CONFIGS["llama-3.1-8b-shape"],
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_type": "llama3"},
    },
    "rope_scaling beside rope_parameters": {
        **NAMED_CONFIGS["llama-3.1-8b-shape"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    },
    "llama gptq": {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **SMALL,
        "num_key_value_heads": 2,
        "dtype": "float16",
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False},
    },
}


def derived(config) -> dict:
    """What brisk takes from a config: the fields it reads and the quantities it computes from them."""
    model_config = ModelConfig.from_hf_config("unused", config, torch.float32, None)
    fields = {name: getattr(config, name, None) for name in READ_FIELDS}
    quant = fields["quantization_config"]
    fields["quantization_config"] = quant if quant is None or isinstance(quant, dict) else quant.to_dict()
    return {
        **fields,
        "num_kv_heads": model_config.num_kv_heads,
        "head_size": model_config.head_size,
        "max_model_len": model_config.max_model_len,
        "gpu dtype": resolve_dtype("auto", config, torch.device("cuda")),
        "rope": {k: v for k, v in rope_parameters(config).items() if v is not None},
        "sliding_window": get_model_class(config).sliding_window(config)
        if getattr(config, "architectures", None)
        else None,
    }


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_brisk_reads_a_config_as_transformers_does(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[name]))
    ours = read_hf_config(tmp_path)
    assert isinstance(ours, JsonConfig)
    assert derived(ours) == derived(AutoConfig.from_pretrained(tmp_path))


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_configs_transformers_writes_read_the_same(tmp_path, arch):
    """transformers 5 writes rope_parameters, dtype and layer_types instead of rope_theta, torch_dtype and nothing."""
    folder = make_tiny_model(tmp_path / arch, arch)
    assert derived(read_hf_config(folder)) == derived(AutoConfig.from_pretrained(folder))


def test_other_families_and_remote_code_go_through_transformers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    assert type(read_hf_config(tmp_path)).__name__ == "GPT2Config"


def test_the_engine_starts_without_importing_transformers():
    """The point of reading configs here: a model with no tokenizer (a named shape with random weights) starts,
    and generates, without transformers in the process."""
    code = (
        "import sys\n"
        "from brisk import LLM, SamplingParams\n"
        "from brisk.bench.configs import materialize\n"
        "with materialize('llama-tiny-shape') as model:\n"
        "    llm = LLM(model=model, load_format='dummy', device='cpu', max_model_len=64)\n"
        "    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, detokenize=False), use_tqdm=False)\n"
        "assert len(out[0].outputs[0].token_ids) == 2\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
