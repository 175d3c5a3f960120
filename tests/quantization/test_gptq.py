"""GPTQ checkpoints (gptqmodel's layout, see ``gptq_checkpoints.py``): 4 and 8 bits, group sizes, activation
order both ways, symmetric both ways, v1 and v2 zero points; brisk's weights equal the dequantized weights
the checkpoint was made from, and its logits and greedy tokens equal transformers run on those weights."""

import pytest
from transformers import AutoTokenizer

from brisk import LLM
from tests.quantization.dequantized import assert_weights_equal, brisk_greedy, model_with_weights, reference_greedy
from tests.quantization.gptq_checkpoints import make_gptq_checkpoint

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def add(a, b):"]
CASES = {  # (bits, group_size, desc_act, sym, checkpoint_format)
    "4bit-g32-sym": (4, 32, False, True, "gptq"),
    "4bit-g64-actorder-asym": (4, 64, True, False, "gptq"),
    "8bit-g32-actorder-sym": (8, 32, True, True, "gptq"),
    "4bit-channel-asym-v2": (4, -1, False, False, "gptq_v2"),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_the_dequantized_model(tiny_llama, tmp_path, case):
    folder, dequantized = make_gptq_checkpoint(tiny_llama, tmp_path / "m", *CASES[case])
    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    assert_weights_equal(llm, dequantized.__getitem__)

    model = model_with_weights(tiny_llama, dequantized)
    assert brisk_greedy(llm, PROMPTS) == reference_greedy(model, AutoTokenizer.from_pretrained(folder), PROMPTS)


def test_fused_parts_with_different_orders(tiny_llama, tmp_path):
    import json
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    folder, _ = make_gptq_checkpoint(tiny_llama, tmp_path / "m", 4, 32, True, True)
    state = load_file(Path(folder) / "model.safetensors")
    name = "model.layers.0.self_attn.k_proj.g_idx"
    state[name] = state[name].flip(0).contiguous()
    save_file(state, Path(folder) / "model.safetensors")
    assert json.loads((Path(folder) / "config.json").read_text())["quantization_config"]["desc_act"]
    with pytest.raises(ValueError, match="GPTQ model.layers.0.self_attn.qkv_proj: the fused parts' g_idx differ"):
        LLM(folder, device="cpu")
