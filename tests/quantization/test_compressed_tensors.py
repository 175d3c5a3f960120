"""compressed-tensors checkpoints (made with the library, as llmcompressor saves them): brisk's logits and greedy
tokens against the library's own decompression run by transformers, float32 on the CPU."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from brisk import LLM, SamplingParams
from tests.quantization.ct_checkpoints import library_reference_model
from tests.quantization.dequantized import assert_weights_equal

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def add(a, b):", "Numbers: 0 1 2 3 4 5"]
MAX_TOKENS = 12

# (preset, weight overrides): every scheme brisk runs, with the storage format and tensors it produces.
SCHEMES = {
    "fp8-dynamic": ("FP8_DYNAMIC", {}),  # float-quantized: per-channel weight scales, per-token inputs
    "fp8-static": ("FP8", {}),  # per-tensor weight scales (per q/k/v shard), static input scales
    "fp8-static-channel": ("FP8", {"strategy": "channel"}),
    # a scale per block of 32 x 32 weights (128 x 128 in the preset), inputs per token and 32 channels
    "fp8-block": ("FP8_BLOCK", {"block_structure": (32, 32), "input_group_size": 32}),
    "w8a8-int8": ("W8A8", {}),  # int-quantized: int8 per-channel weights, int8 per-token inputs
    "w8a16-g32": ("W8A16", {"group_size": 32}),  # pack-quantized, 4 values an int32
    "w4a16-g32": ("W4A16", {"group_size": 32}),  # pack-quantized, 8 values an int32
    "w4a16-g64-asym": ("W4A16_ASYM", {"group_size": 64}),  # + packed zero points
    "w4a16-channel": ("W4A16", {"strategy": "channel", "group_size": None}),
    "nvfp4a16": ("NVFP4A16", {}),
    "mxfp4a16": ("MXFP4A16", {}),  # mxfp4-pack-quantized: FP4 values, power-of-two (E8M0) scales per 32 inputs
    # the down projections left unquantized by a regex in the ignore list
    "w4a16-g32-ignore-down": (
        "W4A16",
        {"group_size": 32, "ignore": ("re:.*mlp.down_proj",)},
    ),  # nvfp4-pack-quantized: FP4 values, FP8 group scales, global scales
}
ACTIVATION_QUANTIZED = {"FP8_DYNAMIC", "FP8", "FP8_BLOCK", "W8A8"}  # presets whose inputs are quantized too


def _reference(base: str, folder: str) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens and the last-position logits of every prompt, from the library's reference model."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = library_reference_model(base, folder)
    tokens, logits = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            logits.append(model(ids).logits[0, -1])
            out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
            tokens.append(out[0, ids.shape[1] :].tolist())
    return tokens, torch.stack(logits)


def _brisk_logits(llm: LLM) -> torch.Tensor:
    """Last-position logits of every prompt through the engine's model (one prefill each)."""
    from brisk.forward_context import set_forward_context
    from brisk.worker.model_runner import _single_sequence_metadata

    runner = llm.engine.model_runner
    tokenizer = llm.get_tokenizer()
    rows = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor(tokenizer(prompt).input_ids)
            metadata = _single_sequence_metadata(len(ids), runner.block_size, runner.device)
            with set_forward_context(metadata):
                hidden = runner.model(ids, torch.arange(len(ids)))
            rows.append(runner.model.compute_logits(hidden[-1:])[0])
    return torch.stack(rows)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_matches_library_reference(ct_checkpoint, tiny_llama, scheme):
    """Greedy tokens exact; last-position logits within 1e-4 (float32 matmuls summed in another order), but for
    the rounding flips of quantized inputs and NVFP4's bfloat16 weights (below)."""
    preset, weight_args = SCHEMES[scheme]
    folder = ct_checkpoint(preset, **weight_args)
    assert json.loads((Path(folder) / "config.json").read_text())["quantization_config"]["quant_method"] == (
        "compressed-tensors"
    )
    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    expected_tokens, expected_logits = _reference(tiny_llama, folder)
    assert torch.isfinite(expected_logits).all(), "the checkpoint itself is broken (non-finite reference logits)"
    got = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == expected_tokens
    got_logits = _brisk_logits(llm)
    if preset == "NVFP4A16":
        # The library hands NVFP4 weights back rounded to bfloat16 (2**-9 relative): logits move by hundredths.
        torch.testing.assert_close(got_logits, expected_logits, rtol=0, atol=0.1)
    elif preset in ACTIVATION_QUANTIZED:
        # Inputs rounded to an 8-bit grid at run time: float32 sums taken in another order upstream move an
        # activation by an ulp, and one sitting on a rounding boundary lands a grid step away, which moves that
        # prompt's logits by hundredths (seen: 0.018 on one prompt of four). A wrong scale or rounding rule would
        # move every prompt: all but one must stay within 1e-4, and none may move further than such a step.
        per_prompt = (got_logits - expected_logits).abs().amax(dim=1)
        assert (per_prompt <= 1e-4).sum() >= len(PROMPTS) - 1 and (per_prompt <= 0.05).all(), per_prompt
    else:
        torch.testing.assert_close(got_logits, expected_logits, rtol=0, atol=1e-4)


def test_nvfp4_weights_equal_the_library_dequantization_in_float32(ct_checkpoint):
    """Every NVFP4 weight, fused q/k/v and gate/up included (each part with its own global scale), equals
    compressed-tensors' ``dequantize`` of the checkpoint's tensors computed in float32."""
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize
    from safetensors.torch import load_file

    folder = ct_checkpoint("NVFP4A16")
    config = json.loads((Path(folder) / "config.json").read_text())["quantization_config"]
    args = QuantizationArgs.model_validate(config["config_groups"]["group_0"]["weights"])
    state = load_file(str(Path(folder) / "model.safetensors"))

    def library(name: str) -> torch.Tensor:
        packed = state[f"{name}.weight_packed"]
        values = unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)
        scale, global_scale = state[f"{name}.weight_scale"].float(), state[f"{name}.weight_global_scale"]
        return dequantize(values, scale, args=args, global_scale=global_scale, dtype=torch.float32)

    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    assert_weights_equal(llm, library)
    down = llm.engine.model_runner.model.model.layers[0].mlp.down_proj  # held packed: half a byte a value
    assert down.weight_packed.dtype == torch.uint8 and down.weight_packed.shape[1] * 2 == down.in_features


def test_w4a16_shape_with_random_weights_runs(tmp_path):
    """``load_format="dummy"`` on a W4A16 config (how INT4 speed is benchmarked without weights): the packed
    weights' recorded shapes are not randomized, so the layout check passes and the engine generates."""
    from brisk.bench.configs import W4A16_QUANTIZATION_CONFIG, write_config_folder

    folder = write_config_folder(
        tmp_path / "w4a16", "llama-tiny-shape", hidden_size=256, intermediate_size=512, head_dim=64,
        quantization_config=W4A16_QUANTIZATION_CONFIG,
    )  # fmt: skip
    llm = LLM(str(folder), device="cpu", load_format="dummy", max_model_len=256, kv_cache_memory_bytes=1 << 22)
    out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
