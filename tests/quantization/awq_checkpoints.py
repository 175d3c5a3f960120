"""AWQ checkpoints of the tiny test models in AutoAWQ's GEMM layout (AutoAWQ no longer installs beside the
transformers brisk tests against): round-to-nearest 4-bit groups of 32, AWQ's interleaved packing, float16 scales."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

GROUP = 32
AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)  # AutoAWQ's pack order: column c goes to nibble [c]


def _pack(values: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit ``[rows, cols]`` to AutoAWQ's int32 ``[rows, cols / 8]``."""
    cols = values.to(torch.int64).unflatten(-1, (-1, 8))
    word = sum(cols[..., c] << (4 * AWQ_NIBBLE_OF_COLUMN[c]) for c in range(8))
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).contiguous()


def _quantize(weight: torch.Tensor, zero_point: bool) -> dict[str, torch.Tensor]:
    """One linear layer's qweight / qzeros / scales (AutoAWQ's shapes: input-major)."""
    groups = weight.t().unflatten(0, (-1, GROUP))  # [in / GROUP, GROUP, out]
    if zero_point:
        lo, hi = groups.amin(1).clamp(max=0), groups.amax(1).clamp(min=0)
        scales = ((hi - lo) / 15).clamp(min=1e-5).half().contiguous()
        zeros = torch.round(-lo / scales.float()).clamp(0, 15)
    else:
        scales = (groups.abs().amax(1) / 7).clamp(min=1e-5).half().contiguous()
        zeros = torch.full_like(scales, 8, dtype=torch.float32)
    q = torch.round(groups / scales.float()[:, None] + zeros[:, None]).clamp(0, 15).flatten(0, 1)
    tensors = {"qweight": _pack(q), "scales": scales}
    if zero_point:
        tensors["qzeros"] = _pack(zeros)
    return tensors


def make_awq_checkpoint(base: str, out: Path, zero_point: bool) -> str:
    """``base`` (a float safetensors folder) as an AWQ checkpoint in ``out``: every ``*_proj`` layer quantized."""
    shutil.copytree(base, out)
    state = load_file(out / "model.safetensors")
    for name in [n for n in state if n.endswith("_proj.weight")]:
        module = name.removesuffix(".weight")
        for suffix, tensor in _quantize(state.pop(name), zero_point).items():
            state[f"{module}.{suffix}"] = tensor
    save_file(state, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": GROUP,
        "zero_point": zero_point,
        "version": "gemm",
    }
    (out / "config.json").write_text(json.dumps(config))
    return str(out)
