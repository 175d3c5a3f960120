"""Model classes keyed by the HF config's ``architectures`` field."""

from __future__ import annotations

import importlib

_MODELS = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("mistral", "MistralForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(hf_config) -> type:
    architectures = getattr(hf_config, "architectures", None) or []
    for arch in architectures:
        if arch in _MODELS:
            module, name = _MODELS[arch]
            return getattr(importlib.import_module(f"brisk.models.{module}"), name)
    raise ValueError(
        f"Model architecture {architectures or '(none given)'} is not supported. "
        f"Supported architectures: {', '.join(supported_architectures())}."
    )
