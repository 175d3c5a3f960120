"""Quantization formats, by the ``quant_method`` name ``config.json``'s ``quantization_config`` (or the
``quantization`` engine argument) gives them. ``get_quantization_config`` resolves which applies."""

from __future__ import annotations

import importlib

from brisk.layers.quantization.base_config import QuantizationConfig

# quant_method -> (module, config class)
QUANTIZATION_METHODS = {
    "fp8": ("fp8", "Fp8Config"),
    "compressed-tensors": ("compressed_tensors", "CompressedTensorsConfig"),
    "awq": ("awq", "AWQConfig"),
    "gptq": ("gptq", "GPTQConfig"),
}
ONLINE_METHODS = ("fp8",)  # formats that quantize an unquantized checkpoint while loading


def _config_class(method: str) -> type[QuantizationConfig]:
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization method {method!r} is not supported; supported: {', '.join(sorted(QUANTIZATION_METHODS))}."
        )
    module, name = QUANTIZATION_METHODS[method]
    return getattr(importlib.import_module(f"brisk.layers.quantization.{module}"), name)


def get_quantization_config(quantization: str | None, hf_config) -> QuantizationConfig | None:
    """The checkpoint's ``quantization_config`` when it has one (the flag, if given, must name the same method),
    else the format ``quantization`` names (one that quantizes while loading), else None."""
    checkpoint = getattr(hf_config, "quantization_config", None)
    if checkpoint is not None and not isinstance(checkpoint, dict):
        checkpoint = checkpoint.to_dict()
    if checkpoint:
        method = checkpoint.get("quant_method")
        if quantization is not None and quantization != method:
            raise ValueError(
                f"quantization={quantization!r}, but the checkpoint's config.json says quant_method {method!r}: "
                "leave quantization unset to use the checkpoint's."
            )
        return _config_class(method).from_config(checkpoint)
    if quantization is None:
        return None
    cls = _config_class(quantization)
    if quantization not in ONLINE_METHODS:
        raise ValueError(
            f"quantization={quantization!r} needs a checkpoint quantized in that format (its config.json has no "
            f"quantization_config); formats that quantize while loading: {', '.join(ONLINE_METHODS)}."
        )
    return cls.from_config({})
