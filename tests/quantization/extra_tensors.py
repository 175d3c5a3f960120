"""A copy of a checkpoint folder with tensors added to its safetensors file (scales a tool would have written)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def with_extra_tensors(folder: str, dst: Path, extra: dict[str, torch.Tensor]) -> str:
    shutil.copytree(folder, dst)
    state = load_file(dst / "model.safetensors")
    state.update(extra)
    save_file(state, dst / "model.safetensors")
    return str(dst)
