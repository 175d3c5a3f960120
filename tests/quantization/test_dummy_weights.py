"""Random weights (``load_format="dummy"``) in quantized formats, for benchmarking a shape without its weights:
every format's scales are positive and give its values the magnitude of plain dummy weights (about 1e-3), so
the logits stay finite and small (an NVFP4 global scale filled like a weight once multiplied them by 1e3 to
1e6: float16 overflowed to NaN)."""

import pytest
import torch

from brisk import LLM, SamplingParams
from tests.quantization.fp8_checkpoints import make_block_fp8_checkpoint

PROMPT = [[5, 17, 42, 99, 7, 3, 250, 11]]


def _dequantized(layer) -> torch.Tensor:
    if hasattr(layer.quant_method, "dequantized_weight"):
        return layer.quant_method.dequantized_weight(layer)
    return layer.weight.float() * layer.weight_scale  # FP8 with its scales kept per row


@pytest.mark.parametrize(
    "preset, args",
    [("NVFP4A16", {}), ("FP8", {}), ("FP8_DYNAMIC", {}), ("W4A16", {"group_size": 32}), ("block", {})],
)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_random_quantized_weights_stay_tame(ct_checkpoint, tiny_llama, tmp_path, preset, args, dtype):
    if preset == "block":
        folder = str(make_block_fp8_checkpoint(tiny_llama, tmp_path / "m", (32, 32)))
    else:
        folder = ct_checkpoint(preset, **args)
    llm = LLM(folder, device="cpu", load_format="dummy", dtype=dtype, kv_cache_memory_bytes=1 << 22)
    qkv = llm.engine.model_runner.model.model.layers[0].self_attn.qkv_proj
    assert 1e-4 < _dequantized(qkv).abs().max() < 0.05
    assert all(p.min() > 0 for n, p in qkv.named_parameters() if n.endswith(("_scale", "_scale_inv")))
    out = llm.generate(PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    logprobs = torch.tensor([next(iter(p.values())).logprob for p in out.prompt_logprobs[1:]])
    # Near-uniform over the vocabulary: the logits are small, not merely finite.
    assert torch.isfinite(logprobs).all() and (logprobs - logprobs.mean()).abs().max() < 1, logprobs
