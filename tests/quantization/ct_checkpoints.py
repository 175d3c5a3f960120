"""compressed-tensors checkpoints of the tiny test models, made with the compressed-tensors library the way
llmcompressor's round-to-nearest ``QuantizationModifier`` makes them (its min-max observer is
``calculate_qparams`` over each weight's rows or groups; static input scales from a calibration pass), and the
library's own reference: its decompression of the saved files, run by transformers with the library's
quantized forward (inputs quantized as the scheme says)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    QuantizationStatus,
    apply_quantization_config,
    disable_quantization,
    enable_quantization,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France. def add(a, b):"


def _weight_min_max(weight: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    if args.strategy == "tensor":
        return weight.amin().reshape(1), weight.amax().reshape(1)
    if args.strategy == "channel":
        return weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)
    if args.strategy in ("group", "tensor_group"):
        groups = weight.unflatten(-1, (-1, args.group_size))
        return groups.amin(-1), groups.amax(-1)
    if args.strategy == "block":
        rows, cols = args.block_structure
        blocks = weight.unflatten(0, (-1, rows)).unflatten(-1, (-1, cols))
        return blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    raise ValueError(f"no observer here for weight strategy {args.strategy}")


def _calibrate_inputs(model, tokenizer) -> None:
    """Static per-tensor input scales from the inputs each quantized layer sees on a short text. The calibration
    pass runs with quantization off: the input scales it computes are still uninitialized memory (the library
    makes them with ``torch.empty``), and a quantized forward through them gave NaN scales on some machines."""
    seen: dict[torch.nn.Module, list[torch.Tensor]] = {}
    hooks = []
    for module in model.modules():
        inputs = getattr(getattr(module, "quantization_scheme", None), "input_activations", None)
        if inputs is not None and not inputs.dynamic:
            hooks.append(module.register_forward_pre_hook(lambda m, args: seen.setdefault(m, []).append(args[0])))
    model.apply(disable_quantization)
    with torch.no_grad():
        model(tokenizer(CALIBRATION_TEXT, return_tensors="pt").input_ids)
    model.apply(enable_quantization)
    for hook in hooks:
        hook.remove()
    for module, values in seen.items():
        x = torch.cat([v.flatten() for v in values])
        scale, zero = calculate_qparams(
            x.amin().reshape(1), x.amax().reshape(1), module.quantization_scheme.input_activations
        )
        module.input_scale.data.copy_(scale.reshape(module.input_scale.shape))
        if hasattr(module, "input_zero_point"):
            module.input_zero_point.data.copy_(zero.reshape(module.input_zero_point.shape))


def make_ct_checkpoint(base: str, out: Path, preset: str, ignore: tuple[str, ...] = (), **weight_args) -> str:
    """Quantize the HF folder ``base`` with the compressed-tensors ``preset`` scheme (``weight_args`` override
    its weight arguments, e.g. ``group_size=32, symmetric=False``, and with an ``input_`` prefix its input
    activations' arguments, e.g. ``input_group_size=32``; ``ignore``: modules left unquantized besides the LM
    head) and save it compressed into ``out``."""
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base)
    scheme = preset_name_to_scheme(preset, ["Linear"])
    for key, value in weight_args.items():
        value = list(value) if isinstance(value, tuple) else value  # the library's fields are lists
        if key.startswith("input_"):
            setattr(scheme.input_activations, key.removeprefix("input_"), value)
        else:
            setattr(scheme.weights, key, value)
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head", *ignore]))
    with torch.no_grad():
        for module in model.modules():
            scheme = getattr(module, "quantization_scheme", None)
            if scheme is None:
                continue
            global_scale = None
            if scheme.weights.strategy == "tensor_group":  # NVFP4: a global scale over the group scales
                global_scale = generate_gparam(module.weight.amin(), module.weight.amax())
                module.weight_global_scale.data.copy_(global_scale)
            lo_hi = _weight_min_max(module.weight, scheme.weights)
            scale, zero = calculate_qparams(*lo_hi, scheme.weights, global_scale=global_scale)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
    _calibrate_inputs(model, tokenizer)
    for module in model.modules():
        if hasattr(module, "quantization_scheme"):
            module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    tokenizer.save_pretrained(out)
    return str(out)


def library_reference_model(base: str, folder: str):
    """transformers' model of ``base`` carrying the checkpoint in ``folder`` as compressed-tensors decompresses
    it: the scheme applied, the saved (compressed) tensors loaded as they are, then ``decompress_model``.

    (transformers' own loader would do the same, but in this version it builds the compressed parameters on the
    meta device, where asymmetric zero points get their unpacked shape, and refuses the checkpoint.)"""
    config = json.loads((Path(folder) / "config.json").read_text())["quantization_config"]
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    quant_config = QuantizationConfig.model_validate(config)
    apply_quantization_config(model, quant_config)
    compressor = ModelCompressor(quantization_config=quant_config)
    with torch.no_grad():
        compressor.compress_model(model)  # only to give the modules their compressed parameters
        state = load_file(str(Path(folder) / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        # Symmetric schemes save no zero points (they are zeros); left alone they would hold uninitialized memory.
        assert not unexpected and all(name.endswith("zero_point") for name in missing), (missing, unexpected)
        for name in missing:
            model.get_parameter(name).zero_()
        compressor.decompress_model(model)
    return model.float()  # NVFP4's decompression hands back bfloat16 weights (rounded: see the NVFP4 test)


def copy_tokenizer(src: str, dst: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (Path(src) / name).is_file():
            shutil.copy(Path(src) / name, dst / name)
