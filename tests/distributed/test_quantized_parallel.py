"""Quantized checkpoints under tensor parallelism, across two real worker processes (gloo on loopback): each
format's packed weights, group and block scales, zero points, per-tensor scales and activation-order ``g_idx`` are split
over the ranks (row-parallel layers keep whole groups; GPTQ's row-parallel ranks keep every group's scales) and
give the greedy tokens of one rank. The tiny Llama's row-parallel layers hold 32 (o_proj) and 64 (down_proj)
inputs per rank, so groups of 32 stay whole."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

from brisk import LLM, SamplingParams

PROMPTS = [[(7 * i + j) % 300 + 10 for j in range(12 + 5 * i)] for i in range(3)]
# Weight-only formats, static input scales and inputs quantized per group of channels (whole groups on each rank):
# each rank computes exactly a slice of the one-rank products.
# The FP8 KV cache with the checkpoint's per-layer k_scale / v_scale: every rank divides its heads by them.
EXACT = ["gptq-4bit-desc-act", "gptq-8bit", "awq", "w4a16-g32-asym", "w4a16-channel-asym", "fp8-static",
         "nvfp4a16", "fp8-kv-scales", "block-fp8", "ct-fp8-block", "fp8-per-tensor-transformers"]  # fmt: skip
# Inputs quantized per token at run time: a row-parallel rank scales its slice of each token by that slice's
# largest magnitude (as vLLM does), a finer quantization than one rank's, so the results differ slightly.
# (FP8_DYNAMIC checkpoints compute what the online FP8 does; W8A8 loads per-channel scales from the checkpoint.)
DYNAMIC = ["fp8-online", "w8a8-int8"]


def _checkpoint(name: str, base: str, tmp_path, ct_checkpoint) -> tuple[str, dict]:
    """The model folder and the engine arguments it needs."""
    from tests.quantization.awq_checkpoints import make_awq_checkpoint
    from tests.quantization.gptq_checkpoints import make_gptq_checkpoint

    if name.startswith("gptq"):
        bits, desc_act = (4, True) if name == "gptq-4bit-desc-act" else (8, False)
        return make_gptq_checkpoint(base, tmp_path / name, bits, 32, desc_act=desc_act, sym=not desc_act)[0], {}
    if name == "awq":
        return make_awq_checkpoint(base, tmp_path / name, zero_point=True), {}
    if name == "fp8-per-tensor-transformers":  # static per-tensor scales under transformers' names
        from tests.quantization.fp8_checkpoints import as_fp8_config

        return str(as_fp8_config(ct_checkpoint("FP8"), tmp_path / name, "static", [], "transformers")), {}
    if name == "block-fp8":  # blocks of 16 outputs: one rank's k and v projections hold 16 each
        from tests.quantization.fp8_checkpoints import make_block_fp8_checkpoint

        return str(make_block_fp8_checkpoint(base, tmp_path / name, (16, 32))), {}
    if name == "fp8-online":
        return base, {"quantization": "fp8"}
    if name == "fp8-kv-scales":
        from tests.quantization.extra_tensors import with_extra_tensors

        names = [f"model.layers.{i}.self_attn.{kv}_scale" for i in range(2) for kv in "kv"]
        scales = {name: torch.tensor(0.25 * (i + 1)) for i, name in enumerate(names)}
        return with_extra_tensors(base, tmp_path / name, scales), {"kv_cache_dtype": "fp8"}
    preset, weight_args = {
        "w4a16-g32-asym": ("W4A16_ASYM", {"group_size": 32}),
        "w4a16-channel-asym": ("W4A16_ASYM", {"strategy": "channel", "group_size": None}),
        "fp8-static": ("FP8", {}),
        "nvfp4a16": ("NVFP4A16", {}),
        "ct-fp8-block": ("FP8_BLOCK", {"block_structure": (16, 32), "input_group_size": 32}),
        "w8a8-int8": ("W8A8", {}),
    }[name]
    return ct_checkpoint(preset, **weight_args), {}


def _generate(model: str, tp: int, pp: int, params: SamplingParams, **kwargs) -> list:
    llm = LLM(model, device="cpu", tensor_parallel_size=tp, pipeline_parallel_size=pp, max_model_len=128,
              max_num_seqs=4, **kwargs)  # fmt: skip
    try:
        return llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        if tp * pp > 1:
            llm.engine.model_runner.shutdown()


@pytest.mark.parametrize(("name", "tp", "pp"), [(name, 2, 1) for name in EXACT] + [("gptq-4bit-desc-act", 1, 2)])
def test_quantized_parallel_matches_one_rank(tiny_llama, tmp_path, ct_checkpoint, name, tp, pp):
    model, kwargs = _checkpoint(name, tiny_llama, tmp_path, ct_checkpoint)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    runs = [_generate(model, *size, greedy, **kwargs) for size in ((tp, pp), (1, 1))]
    tokens = [[out.outputs[0].token_ids for out in run] for run in runs]
    assert tokens[0] == tokens[1]
    assert multiprocessing.active_children() == []


def _prompt_logprobs(model: str, tp: int, **kwargs) -> list[float]:
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    outputs = _generate(model, tp, 1, params, **kwargs)
    return [pos[t].logprob for out in outputs for pos, t in zip(out.prompt_logprobs[1:], out.prompt_token_ids[1:])]


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_input_quantization_under_tensor_parallelism(tiny_llama, tmp_path, ct_checkpoint, name):
    """Two ranks round the row-parallel inputs differently from one (other scales), not worse: the prompt's
    log-probabilities stay as close to the unquantized model's as one rank's are (mean absolute difference
    within 1.5x; a wrong shard or scale is many times off)."""
    model, kwargs = _checkpoint(name, tiny_llama, tmp_path, ct_checkpoint)
    unquantized = _prompt_logprobs(tiny_llama, 1)

    def error(tp: int) -> float:
        logprobs = _prompt_logprobs(model, tp, **kwargs)
        return sum(abs(a - b) for a, b in zip(logprobs, unquantized)) / len(unquantized)

    two_ranks, one_rank = error(2), error(1)
    assert 0 < two_ranks < 1.5 * one_rank, (two_ranks, one_rank)


def test_groups_split_by_the_ranks_are_a_startup_error(ct_checkpoint):
    """o_proj's 64 inputs in groups of 64 cannot be split over two ranks: the error names the sizes and the fix."""
    model = ct_checkpoint("W4A16_ASYM", group_size=64)
    with pytest.raises(RuntimeError, match=r"o_proj: group_size 64 does not divide the input size 32 of each rank "
                       r"\(64 split over tensor_parallel_size=2\); use fewer ranks"):  # fmt: skip
        LLM(model, device="cpu", tensor_parallel_size=2, max_model_len=128)
    assert multiprocessing.active_children() == []
