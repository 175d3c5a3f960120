"""GPTQ, AWQ and compressed-tensors integer checkpoints in the layout the GPU's Triton kernels read
(``packed_int.py``; compressed-tensors' packed words as loaded): repacked at load time, activation order sorted
by group, zero points and scales per group. The kernels run here under Triton's interpreter: the test routes the
loaded weights to them on the CPU (``use_int_kernels``, which picks CUDA otherwise) and checks the greedy tokens
and first-step logits against the CPU's float32 dequantization. The prompts reach all three kernels: one row (a
decode alone), 2 to 16 (a short prefill, two decodes) and more (the long prompt's prefill)."""

import pytest

from brisk import LLM, SamplingParams
from tests.quantization.awq_checkpoints import make_awq_checkpoint
from tests.quantization.gptq_checkpoints import make_gptq_checkpoint

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Once upon a time, in a kingdom by the sea, there lived a king who had three daughters and one old horse",
]
PARAMS = SamplingParams(temperature=0, max_tokens=4, logprobs=3)


def _run(folder: str) -> tuple[list[list[int]], list[dict], bool]:
    """Greedy tokens, first-step logprobs, and whether the layers hold the kernels' packed layout."""
    llm = LLM(folder, device="cpu", kv_cache_memory_bytes=1 << 22)
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False) + llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)
    packed = any(hasattr(m, "weight_packed") for m in llm.engine.model_runner.model.modules())
    return [o.outputs[0].token_ids for o in outputs], [o.outputs[0].logprobs[0] for o in outputs], packed


def _assert_kernel_layout_matches(folder: str, monkeypatch) -> None:
    expected_tokens, expected_logprobs, packed = _run(folder)
    assert not packed
    for module in ("gptq", "awq", "compressed_tensors.wna16"):
        monkeypatch.setattr(f"brisk.layers.quantization.{module}.use_int_kernels", lambda weight: True)
    tokens, logprobs, packed = _run(folder)
    assert packed
    assert tokens == expected_tokens  # the batch of three, then one prompt alone (its decodes: the GEMV)
    for got, want in zip(logprobs, expected_logprobs):
        assert got.keys() == want.keys()
        for token in want:
            assert got[token].logprob == pytest.approx(want[token].logprob, abs=1e-4)


@pytest.mark.parametrize(("bits", "group", "desc_act", "sym"), [(4, 32, True, False), (8, 64, False, True)])
def test_gptq(tiny_llama, tmp_path, monkeypatch, bits, group, desc_act, sym):
    folder, _ = make_gptq_checkpoint(tiny_llama, tmp_path / "m", bits, group, desc_act, sym, "gptq")
    _assert_kernel_layout_matches(folder, monkeypatch)


@pytest.mark.parametrize("zero_point", [True, False])
def test_awq(tiny_llama, tmp_path, monkeypatch, zero_point):
    _assert_kernel_layout_matches(make_awq_checkpoint(tiny_llama, tmp_path / "m", zero_point), monkeypatch)


@pytest.mark.parametrize(("preset", "group"), [("W4A16_ASYM", 32), ("W8A16", 64)])
def test_compressed_tensors(ct_checkpoint, monkeypatch, preset, group):
    """Zero points unpacked along the outputs (asymmetric) must reach the kernels in rows: transposed in memory,
    they were read as other rows' zero points on the GPU."""
    _assert_kernel_layout_matches(ct_checkpoint(preset, group_size=group), monkeypatch)
