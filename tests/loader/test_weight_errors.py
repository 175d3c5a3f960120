"""A checkpoint whose tensors are missing, misshapen, of the wrong type, duplicated or unreadable is refused with
an error naming the tensor or file (not loaded half-empty, truncated or broadcast)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from brisk import LLM, SamplingParams

LAYER0 = "model.layers.0."


@pytest.fixture
def checkpoint(tiny_llama, tmp_path):
    """A copy of the tiny llama folder, and a function that rewrites its weights."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    (weights_file,) = folder.glob("*.safetensors")
    tensors = load_file(weights_file)

    def rewrite(change) -> str:
        changed = dict(tensors)
        change(changed)
        save_file({k: v.contiguous() for k, v in changed.items()}, weights_file)
        return str(folder)

    return rewrite, tensors


@pytest.mark.parametrize("part", ["self_attn.k_proj", "self_attn.q_proj", "mlp.up_proj", "mlp.gate_proj"])
def test_a_missing_part_of_a_fused_projection(checkpoint, part):
    rewrite, _ = checkpoint
    folder = rewrite(lambda t: t.pop(f"{LAYER0}{part}.weight"))
    with pytest.raises(ValueError, match=rf"checkpoint is missing tensors: \['{LAYER0}{part}.weight'\]"):
        LLM(folder, device="cpu")


@pytest.mark.parametrize(
    "name, reshape",
    [
        ("self_attn.q_proj.weight", lambda w: torch.cat([w, w])),  # larger: would be silently cut
        ("mlp.gate_proj.weight", lambda w: torch.cat([w, w])),
        ("mlp.down_proj.weight", lambda w: torch.cat([w, w], dim=1)),
        ("self_attn.o_proj.weight", lambda w: w[:1]),  # one row: would be broadcast
        ("self_attn.v_proj.weight", lambda w: w[: w.shape[0] // 2]),  # smaller: a bare narrow() error before
        ("input_layernorm.weight", lambda w: torch.cat([w, w])),
    ],
)
def test_a_misshapen_tensor(checkpoint, name, reshape):
    rewrite, tensors = checkpoint
    full = LAYER0 + name
    expected = tuple(tensors[full].shape)

    def change(t):
        t[full] = reshape(t[full])

    folder = rewrite(change)
    message = rf"checkpoint tensor '{full}': checkpoint shape .*, expected {re.escape(str(expected))}"
    with pytest.raises(ValueError, match=message):
        LLM(folder, device="cpu")


def test_an_integer_tensor(checkpoint):
    rewrite, _ = checkpoint
    name = f"{LAYER0}self_attn.o_proj.weight"

    def change(t):
        t[name] = t[name].to(torch.int8)

    message = rf"'{name}': dtype torch.int8, expected torch.float32 \(a quantized checkpoint needs"
    with pytest.raises(ValueError, match=message):
        LLM(rewrite(change), device="cpu")


def test_a_tensor_in_two_files(checkpoint):
    rewrite, tensors = checkpoint
    folder = Path(rewrite(lambda t: None))
    name = f"{LAYER0}mlp.up_proj.weight"
    save_file({name: tensors[name] * 2}, folder / "extra.safetensors")
    with pytest.raises(ValueError, match=rf"Tensor '{name}' is in both"):
        LLM(str(folder), device="cpu")


def test_the_index_names_the_files(checkpoint):
    """With model.safetensors.index.json, only the files it lists are read (another export beside them is not)."""
    rewrite, tensors = checkpoint
    folder = Path(rewrite(lambda t: None))
    (weights_file,) = folder.glob("*.safetensors")
    save_file({"something.else": torch.zeros(2)}, folder / "consolidated.safetensors")
    index = {"metadata": {}, "weight_map": {name: weights_file.name for name in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    out = LLM(str(folder), device="cpu").generate([[5, 6, 7]], params, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="lists files that are not in"):
        LLM(str(folder), device="cpu")


def test_a_truncated_file(checkpoint):
    rewrite, _ = checkpoint
    folder = Path(rewrite(lambda t: None))
    (weights_file,) = folder.glob("*.safetensors")
    weights_file.write_bytes(weights_file.read_bytes()[:1000])
    with pytest.raises(ValueError, match=rf"{weights_file.name} is not a readable safetensors file"):
        LLM(str(folder), device="cpu")
