"""Tensor parallelism across real worker processes (gloo on loopback): TP=2 gives the same tokens as one rank on
tiny Llama, Qwen2 and Qwen3 models whose KV heads are equal to, fewer than and more than the two ranks, with
chunked prefill, prefix caching, preemption, async scheduling and ``n > 1`` in the same run."""

from __future__ import annotations

import logging

import pytest

from brisk import LLM, SamplingParams
from tests.tiny_models import make_tiny_model

BLOCK_SIZE = 16
NUM_KV_BLOCKS = 12  # fewer than the batch needs: requests are preempted and recomputed
# (arch, KV heads): 4 attention heads each, so with two ranks the KV heads are split, replicated, or split in two
MODELS = [("llama", 2), ("qwen2", 1), ("qwen3", 4)]


def _kv_bytes(model: str, tp: int) -> int:
    import json
    import pathlib

    config = json.loads((pathlib.Path(model) / "config.json").read_text())
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = max(1, config["num_key_value_heads"] // tp)
    per_token = 2 * config["num_hidden_layers"] * kv_heads * head * 4  # float32 keys and values
    return NUM_KV_BLOCKS * BLOCK_SIZE * per_token


def _engine(model: str, tp: int) -> LLM:
    return LLM(
        model,
        device="cpu",
        tensor_parallel_size=tp,
        max_model_len=128,
        max_num_batched_tokens=40,  # prompts of 50+ tokens are computed in chunks
        max_num_seqs=6,
        kv_cache_memory_bytes=_kv_bytes(model, tp),
        async_scheduling=True,
    )


def _run(llm: LLM) -> list[list[list[int]]]:
    prefix = [(5 * i + 3) % 300 + 10 for i in range(40)]  # shared by every prompt: later ones hit the cache
    prompts = [prefix + [(7 * i + j) % 300 + 10 for j in range(10 + i)] for i in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    params = [greedy] * 5 + [SamplingParams(n=2, temperature=0.9, seed=11, max_tokens=24, ignore_eos=True)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [[c.token_ids for c in out.outputs] for out in outputs]


@pytest.mark.parametrize(("arch", "kv_heads"), MODELS)
def test_tp2_matches_one_rank(tmp_path, caplog, arch, kv_heads):
    model = str(make_tiny_model(tmp_path / arch, arch, num_kv_heads=kv_heads))
    one_rank = _engine(model, 1)
    expected = _run(one_rank)
    with caplog.at_level(logging.INFO, logger="brisk.engine.engine"):
        llm = _engine(model, 2)
    try:
        # the start-up arithmetic: each rank holds about half the weights and plans its own KV cache
        assert f"= {NUM_KV_BLOCKS * BLOCK_SIZE} tokens" in caplog.text and "per rank (2 ranks)" in caplog.text
        assert llm.engine.model_runner.weight_bytes() < 0.6 * one_rank.engine.model_runner.weight_bytes()
        assert _run(llm) == expected
        stats = llm.engine.get_stats()
        assert llm.engine.scheduler.num_preemptions > 0
        assert stats.prefix_cache_hits > 0
    finally:
        llm.engine.model_runner.shutdown()
