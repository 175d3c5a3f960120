"""Build a model and fill its weights: from safetensors files, or random ("dummy") for benchmarks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from brisk.config import ModelConfig
from brisk.distributed.parallel_state import get_tp_size
from brisk.layers.quantization.fp8_utils import FP8_DTYPES
from brisk.loader.lazy_tensor import LazyTensor
from brisk.models.registry import get_model_class


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's files: those its ``model.safetensors.index.json`` lists when it has one (a folder may also
    hold other exports, such as Mistral's ``consolidated.safetensors``), else every ``*.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{index} is not a safetensors index (a 'weight_map' of tensor -> file): {exc}") from exc
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise FileNotFoundError(f"{index} lists files that are not in {folder}: {absent[:4]}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"No *.safetensors files in {folder}. Point model= at a folder with weights, "
            "or pass load_format='dummy' for random weights."
        )
    return files


def iterate_safetensors(
    folder: Path, device: torch.device, lazy: bool = False
) -> Iterator[tuple[str, torch.Tensor | LazyTensor]]:
    """Every checkpoint tensor by name; ``lazy``: as ``LazyTensor``s, so that a rank reads only its shard."""
    from safetensors import SafetensorError, safe_open

    seen: dict[str, str] = {}
    for file in safetensors_files(folder):
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                    if name in seen:
                        raise ValueError(f"Tensor {name!r} is in both {seen[name]} and {file.name} in {folder}.")
                    seen[name] = file.name
                    yield name, LazyTensor(f.get_slice(name)) if lazy else f.get_tensor(name)
        except SafetensorError as exc:
            raise ValueError(f"{file} is not a readable safetensors file ({exc}); is it complete?") from exc


def fill_dummy_weights(model: nn.Module, seed: int) -> None:
    """Small uniform values: numerically tame through many layers, same speed as real weights. Quantized formats'
    scales are positive and set their values' magnitude: about 1e-3 (a global scale, which divides, is 1), and FP8
    values are uniform in -1..1 (``uniform_`` has no FP8 kernel)."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if not getattr(param, "random_fill", True):  # layout metadata (a packed weight's shape) keeps its value
            continue
        if param.device not in generators:
            generators[param.device] = torch.Generator(device=param.device).manual_seed(seed)
        generator = generators[param.device]
        is_fp8 = param.dtype in FP8_DTYPES
        if name.endswith("global_scale"):
            param.data.fill_(1.0)
        elif name.endswith(("_scale", "_scale_inv")) and param.is_floating_point():
            if is_fp8:  # FP8 group scales (NVFP4): the smallest FP8 subnormal's multiple nearest 1e-3
                param.data.fill_(2.0**-9)
            else:
                param.data.uniform_(1e-3, 2e-3, generator=generator)
        elif is_fp8:
            values = torch.empty(param.shape, device=param.device).uniform_(-1, 1, generator=generator)
            param.data.copy_(values)
        elif param.is_floating_point():
            param.data.uniform_(-1e-3, 1e-3, generator=generator)
        else:  # quantized integer codes (random values of a 4-bit range)
            param.data.random_(0, 16, generator=generator)


def load_model(model_config: ModelConfig, device: torch.device, load_format: str, attention_backend: str, seed: int):
    model_cls = get_model_class(model_config.hf_config)
    quant_config = model_config.quant_config
    if quant_config is not None:
        packed: dict[str, list[str]] = {}
        for fragment, (fused, _) in model_cls.packed_modules_mapping.items():
            packed.setdefault(fused, []).append(fragment)
        quant_config.packed_modules = packed
    with torch.device(device):
        model = model_cls(
            model_config.hf_config, model_config.dtype, model_config.max_model_len, attention_backend, quant_config
        )
    if load_format == "dummy":
        fill_dummy_weights(model, seed)
    else:
        model.load_weights(iterate_safetensors(model_config.path, device, lazy=get_tp_size() > 1))
    for module in model.modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None:
            quant_method.process_weights_after_loading(module)
    return model.eval()
