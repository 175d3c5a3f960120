"""Checkpoints with ``quant_method: "fp8"``: block-wise FP8 in transformers' FineGrainedFP8 layout, written from a
float checkpoint as DeepSeek-V3's and Qwen3's FP8 releases store them (each linear layer's ``weight`` in FP8 and a
float32 ``weight_scale_inv`` per block; transformers itself quantizes to this layout only on a GPU), optionally with
an FP8 embedding table, and per-tensor FP8 under AutoFP8's or transformers' config, from a compressed-tensors
checkpoint's tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def quantize_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values and a scale per block (its largest magnitude over FP8's largest), as DeepSeek's and
    transformers' block quantizers compute them."""
    blocks = weight.float().unflatten(0, (-1, block[0])).unflatten(-1, (-1, block[1]))
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    values = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values.flatten(-2).flatten(0, 1), scale


def make_block_fp8_checkpoint(base: str, out: Path, block: tuple[int, int], not_converted: tuple = (), **config):
    """``base``'s linear layers (not those named in ``not_converted``) in block-wise FP8, saved into ``out``;
    ``config`` overrides fields of its ``quantization_config``."""
    shutil.copytree(base, out)
    state = load_file(out / "model.safetensors")
    for name in list(state):
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module.endswith(LINEARS) and not any(m in module for m in not_converted):
            state[name], state[f"{module}.weight_scale_inv"] = quantize_blocks(state[name], block)
    save_file(state, out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": list(block),
        **({"modules_to_not_convert": list(not_converted)} if not_converted else {}),
        **config,
    }
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def quantize_embedding(folder: Path) -> Path:
    """``folder``'s embedding table in FP8 with one float32 ``weight_scale`` of shape (1,), listed in
    ``modules_to_convert``: as transformers stores an ``FP8Embedding``."""
    state = load_file(folder / "model.safetensors")
    table = state["model.embed_tokens.weight"].float()
    scale = (table.abs().max() / FP8_MAX).reshape(1)
    state["model.embed_tokens.weight"] = (table / scale).to(torch.float8_e4m3fn)
    state["model.embed_tokens.weight_scale"] = scale
    save_file(state, folder / "model.safetensors")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"]["modules_to_convert"] = ["embed_tokens"]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def as_fp8_config(ct_folder: str, out: Path, activation_scheme: str, ignored: list[str], layout: str) -> Path:
    """The compressed-tensors checkpoint under AutoFP8's config, or transformers' (``weight_block_size`` null, its
    tensors renamed ``weight_scale_inv`` and ``activation_scale``)."""
    shutil.copytree(ct_folder, out)
    config = json.loads((out / "config.json").read_text())
    quantization = {"quant_method": "fp8", "activation_scheme": activation_scheme}
    if layout == "autofp8":
        quantization["ignored_layers"] = ["lm_head", *ignored]
    else:
        quantization |= {
            "weight_block_size": None,
            "dequantize": False,
            "modules_to_not_convert": ["lm_head", *ignored],
        }
        renames = {".weight_scale": ".weight_scale_inv", ".input_scale": ".activation_scale"}
        state = load_file(out / "model.safetensors")
        for name in list(state):
            for old, new in renames.items():
                if name.endswith(old):
                    state[name.removesuffix(old) + new] = state.pop(name)
        save_file(state, out / "model.safetensors")
    config["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(config))
    return out
