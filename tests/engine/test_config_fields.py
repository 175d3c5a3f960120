"""Config fields a family's HF modeling code ignores are ignored by brisk too, and the ones it honours give HF's
tokens; what brisk cannot compute the same way is refused (never computed differently in silence)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from brisk import LLM, SamplingParams
from tests.engine.test_hf_parity import hf_greedy

LONG_PROMPT = "Once upon a time there was a small engine that served many requests quickly. " * 3  # > 48 tokens


def edited(tiny_model_factory, tmp_path: Path, arch: str, **fields) -> str:
    """A copy of the tiny ``arch`` model with ``fields`` set in config.json (None: removed). ``layer_types`` is
    dropped so that transformers derives it again from the window fields."""
    folder = tmp_path / arch
    shutil.copytree(tiny_model_factory(arch), folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("layer_types", None)
    for key, value in fields.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize(
    "arch, fields",
    [
        ("llama", {"hidden_act": "swish"}),  # transformers' swish is SiLU
        ("qwen2", {"attention_bias": True, "mlp_bias": True}),  # Qwen2: q/k/v biases only, whatever the config
        ("qwen3", {"mlp_bias": True}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 48, "max_window_layers": 2}),  # no layer windowed
    ],
    ids=["llama-swish", "qwen2-biases", "qwen3-mlp-bias", "qwen2-window-on-no-layer"],
)
def test_fields_the_family_ignores_or_that_change_nothing(tiny_model_factory, tmp_path, arch, fields):
    folder = edited(tiny_model_factory, tmp_path, arch, **fields)
    params = SamplingParams(temperature=0, max_tokens=8)
    got = LLM(folder, device="cpu").generate([LONG_PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids
    assert got == hf_greedy(folder, [LONG_PROMPT], max_tokens=8)[0]


@pytest.mark.parametrize(
    "arch, fields",
    [
        ("mistral", {"use_sliding_window": False}),  # HF's Mistral has no such switch: it still windows
        ("llama", {"sliding_window": 48}),  # HF's Llama generate keeps 48 keys in its cache
        ("qwen2", {"use_sliding_window": True, "sliding_window": 48, "max_window_layers": 1}),  # layer 1 windowed
    ],
    ids=["mistral-use-sliding-window-false", "llama-window", "qwen2-window-on-layer-1"],
)
def test_a_window_that_applies_is_refused_beyond_it(tiny_model_factory, tmp_path, arch, fields):
    folder = edited(tiny_model_factory, tmp_path, arch, **fields)
    with pytest.raises(ValueError, match="sliding-window attention .window 48"):
        LLM(folder, device="cpu")
    LLM(folder, device="cpu", max_model_len=48)  # within the window, full attention is exact


def test_tied_embeddings_with_a_different_lm_head_are_refused(tiny_model_factory, tmp_path):
    folder = Path(edited(tiny_model_factory, tmp_path, "qwen2"))  # qwen2's tiny model ties its embeddings
    (weights_file,) = folder.glob("*.safetensors")
    tensors = load_file(weights_file)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0
    save_file(tensors, weights_file)
    with pytest.raises(ValueError, match="tie_word_embeddings, but the checkpoint's lm_head.weight differs"):
        LLM(str(folder), device="cpu")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # an equal copy is fine
    save_file(tensors, weights_file)
    assert LLM(str(folder), device="cpu").engine.model_runner.model.lm_head.weight.dtype == torch.float32
