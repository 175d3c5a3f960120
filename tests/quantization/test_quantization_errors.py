"""Quantized checkpoints and flags brisk cannot run exactly: each a ValueError naming what to change, raised
while the engine starts (before any request)."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from brisk import LLM, SamplingParams

LAYER0 = "model.layers.0."


def _edited(folder: str, dst: Path, config=None, tensors=None) -> str:
    """A copy of ``folder`` with ``config(quantization_config)`` and ``tensors(state_dict)`` applied in place."""
    shutil.copytree(folder, dst)
    if config is not None:
        data = json.loads((dst / "config.json").read_text())
        config(data.setdefault("quantization_config", {}))
        (dst / "config.json").write_text(json.dumps(data))
    if tensors is not None:
        state = load_file(dst / "model.safetensors")
        tensors(state)
        save_file(state, dst / "model.safetensors")
    return str(dst)


def _start(folder: str, **kwargs) -> None:
    LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22, **kwargs)


def test_unknown_quant_method(tiny_llama, tmp_path):
    folder = _edited(tiny_llama, tmp_path / "m", config=lambda q: q.update(quant_method="bitsandbytes"))
    with pytest.raises(ValueError, match="quantization method 'bitsandbytes' is not supported; supported: "):
        _start(folder)


def test_unknown_quantization_flag(tiny_llama):
    with pytest.raises(ValueError, match=r"quantization must be one of \['awq', 'compressed-tensors', 'fp8', 'gptq'\]"):
        _start(tiny_llama, quantization="int3")


def test_checkpoint_format_flag_on_an_unquantized_checkpoint(tiny_llama):
    with pytest.raises(ValueError, match="quantization='compressed-tensors' needs a checkpoint quantized"):
        _start(tiny_llama, quantization="compressed-tensors")


def test_flag_disagrees_with_the_checkpoint(ct_checkpoint):
    with pytest.raises(ValueError, match="quantization='fp8', but the checkpoint's config.json says quant_method"):
        _start(ct_checkpoint("W4A16", group_size=32), quantization="fp8")


def test_missing_scale_tensor(ct_checkpoint, tmp_path):
    name = f"{LAYER0}self_attn.k_proj.weight_scale"
    folder = _edited(ct_checkpoint("W4A16", group_size=32), tmp_path / "m", tensors=lambda t: t.pop(name))
    with pytest.raises(ValueError, match=rf"checkpoint is missing tensors: \['{name}'\]"):
        _start(folder)


def test_mismatched_scale_tensor(ct_checkpoint, tmp_path):
    name = f"{LAYER0}mlp.up_proj.weight_scale"
    folder = _edited(
        ct_checkpoint("W4A16", group_size=32),
        tmp_path / "m",
        tensors=lambda t: t.update({name: t[name][:, :1].contiguous()}),
    )
    with pytest.raises(
        ValueError, match=rf"checkpoint tensor '{name}': checkpoint shape \(128, 1\), expected \(128, 2\)"
    ):
        _start(folder)


def test_group_size_that_does_not_divide_the_input(ct_checkpoint, tmp_path):
    def regroup(q):
        q["config_groups"]["group_0"]["weights"]["group_size"] = 48

    folder = _edited(ct_checkpoint("W4A16", group_size=32), tmp_path / "m", config=regroup)
    with pytest.raises(ValueError, match="self_attn.qkv_proj: group_size 48 does not divide the input size 64"):
        _start(folder)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"strategy": "tensor_group", "group_size": 16}, "weights strategy 'tensor_group'"),
        ({"actorder": "group"}, "weights actorder='group'"),
    ],
)
def test_unsupported_weight_scheme(ct_checkpoint, tmp_path, change, message):
    folder = _edited(
        ct_checkpoint("FP8_DYNAMIC"),
        tmp_path / "m",
        config=lambda q: q["config_groups"]["group_0"]["weights"].update(change),
    )
    with pytest.raises(ValueError, match=rf"compressed-tensors scheme of model.layers.0.self_attn.qkv_proj: {message}"):
        _start(folder)


@pytest.mark.parametrize("actorder", ["static", "weight"])
def test_weight_activation_order_loads_as_without(ct_checkpoint, tmp_path, actorder):
    """llmcompressor's GPTQModifier writes actorder "static" (an alias of "weight") by default: it ordered the
    calibration only, the saved groups are in column order, so the tokens equal the same checkpoint without it."""
    plain = ct_checkpoint("W4A16", group_size=32)
    folder = _edited(
        plain, tmp_path / "m", config=lambda q: q["config_groups"]["group_0"]["weights"].update(actorder=actorder)
    )
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 9, 17, 33, 65, 129]]

    def tokens(model: str) -> list[int]:
        llm = LLM(model, device="cpu", dtype="float32", kv_cache_memory_bytes=1 << 22)
        return llm.generate(prompts, params, use_tqdm=False)[0].outputs[0].token_ids

    assert tokens(folder) == tokens(plain)


def test_unsupported_format(ct_checkpoint, tmp_path):
    folder = _edited(
        ct_checkpoint("FP8_DYNAMIC"),
        tmp_path / "m",
        config=lambda q: q["config_groups"]["group_0"].update(format="nvfp4-pack-quantized"),
    )
    with pytest.raises(ValueError, match="format 'nvfp4-pack-quantized' with float 8-bit weights"):
        _start(folder)


def test_fused_parts_quantized_differently(ct_checkpoint, tmp_path):
    folder = _edited(
        ct_checkpoint("FP8_DYNAMIC"), tmp_path / "m", config=lambda q: q["ignore"].append(f"{LAYER0}self_attn.k_proj")
    )
    with pytest.raises(ValueError, match="quantizes the parts of fused layer model.layers.0.self_attn.qkv_proj"):
        _start(folder)


def test_blocks_that_do_not_tile_a_fused_part(ct_checkpoint, tmp_path):
    """An FP8_DYNAMIC checkpoint that claims blocks of 128 x 128: the tiny Llama's q projection has 64 outputs."""
    folder = _edited(
        ct_checkpoint("FP8_DYNAMIC"),
        tmp_path / "m",
        config=lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block", block_structure=[128, 128]),
    )
    with pytest.raises(ValueError, match=r"qkv_proj: blocks of \[128, 128\] do not tile its weight: outputs \[64, 32"):
        _start(folder)
