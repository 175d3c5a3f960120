"""Build a model and fill its weights: from safetensors files, or random ("dummy") for benchmarks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from brisk.config import ModelConfig
from brisk.models.registry import get_model_class


def iterate_safetensors(folder: Path, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"No *.safetensors files in {folder}. Point model= at a folder with weights, "
            "or pass load_format='dummy' for random weights."
        )
    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_tensor(name)


def fill_dummy_weights(model: nn.Module, seed: int) -> None:
    """Small uniform values: numerically tame through many layers, same speed as real weights."""
    generators: dict[torch.device, torch.Generator] = {}
    for param in model.parameters():
        if param.device not in generators:
            generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
        param.data.uniform_(-1e-3, 1e-3, generator=generators[param.device])


def load_model(model_config: ModelConfig, device: torch.device, load_format: str, attention_backend: str, seed: int):
    model_cls = get_model_class(model_config.hf_config)
    with torch.device(device):
        model = model_cls(model_config.hf_config, model_config.dtype, model_config.max_model_len, attention_backend)
    if load_format == "dummy":
        fill_dummy_weights(model, seed)
    else:
        model.load_weights(iterate_safetensors(model_config.path, device))
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(module)
    return model.eval()
