"""FP8 checkpoints with one scale per tensor in AutoFP8's and vLLM's layout (``quant_method: "fp8"`` without
``weight_block_size``: ``weight`` in FP8, ``weight_scale``, and with ``activation_scheme: "static"`` an
``input_scale``; the layout of the 2024 "-FP8" releases), and in transformers' (``weight_block_size`` null,
``weight_scale_inv`` and ``activation_scale``). Those are the tensors compressed-tensors saves for FP8
with per-tensor scales, so the library makes them here and only the config differs: brisk's greedy tokens equal
the library's decompression run by transformers, and its logits brisk's on the compressed-tensors config."""

import pytest
import torch
from transformers import AutoTokenizer

from brisk import LLM, SamplingParams
from brisk.layers.linear import UnquantizedLinearMethod
from tests.quantization.ct_checkpoints import library_reference_model
from tests.quantization.dequantized import brisk_greedy, reference_greedy
from tests.quantization.fp8_checkpoints import as_fp8_config

PROMPTS = ["The quick brown fox", "Paris is the capital of", "def add(a, b):", "Numbers: 0 1 2 3 4 5"]


def last_logits(llm: LLM) -> torch.Tensor:
    """The five most likely next tokens' log-probabilities after each prompt."""
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return torch.tensor([[lp.logprob for lp in o.outputs[0].logprobs[0].values()] for o in outputs])


@pytest.mark.parametrize("layout", ["autofp8", "transformers"])
@pytest.mark.parametrize(
    ("scheme", "preset", "args"),
    [
        ("static", "FP8", {}),  # a per-tensor input scale (the largest of q, k and v's for the fused layer)
        ("dynamic", "FP8_DYNAMIC", {"strategy": "tensor"}),  # inputs quantized per token
        ("static", "FP8", {"ignore": ("re:.*mlp.down_proj",)}),  # ignored_layers left in float
    ],
)
def test_matches_the_library_on_the_same_tensors(ct_checkpoint, tiny_llama, tmp_path, scheme, preset, args, layout):
    ct_folder = ct_checkpoint(preset, **args)
    ignored = ["down_proj"] if "ignore" in args else []
    folder = as_fp8_config(ct_folder, tmp_path / "m", scheme, ignored, layout)
    llm = LLM(str(folder), device="cpu", kv_cache_memory_bytes=1 << 22)
    layer = llm.engine.model_runner.model.model.layers[0]
    assert layer.self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    assert (type(layer.mlp.down_proj.quant_method) is UnquantizedLinearMethod) == bool(ignored)
    model = library_reference_model(tiny_llama, ct_folder)
    assert brisk_greedy(llm, PROMPTS) == reference_greedy(model, AutoTokenizer.from_pretrained(folder), PROMPTS)
    ct = LLM(ct_folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    assert torch.equal(last_logits(llm), last_logits(ct))
