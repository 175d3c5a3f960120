"""Tensor and pipeline parallelism across real worker processes (gloo on loopback): TP=2, PP=2 and TP=2 x PP=2
(four processes) give the same tokens as one rank on tiny Llama, Qwen2 and Qwen3 models whose KV heads are equal
to, fewer than and more than the two tensor-parallel ranks, with chunked prefill, prefix caching, preemption,
async scheduling (TP only) and ``n > 1`` in the same run."""

from __future__ import annotations

import json
import logging
import re

import jsonschema
import pytest

from brisk import LLM, SamplingParams
from tests.tiny_models import make_tiny_model

BLOCK_SIZE = 16
NUM_KV_BLOCKS = 12  # fewer than the batch needs: requests are preempted and recomputed
# (arch, KV heads, TP, PP): 4 attention heads each, so with two tensor-parallel ranks the KV heads are split,
# replicated, or split in two; the tiny models' 2 layers make 2 pipeline stages of one layer each (Qwen2 ties its
# LM head to the embedding, which the first stage owns: the last stage loads the embedding into its head)
LAYOUTS = [
    ("llama", 2, 2, 1),
    ("qwen2", 1, 2, 1),
    ("qwen3", 4, 2, 1),
    ("llama", 2, 1, 2),
    ("qwen2", 1, 2, 2),
]


def _kv_bytes(model: str, tp: int, pp: int) -> int:
    import json
    import pathlib

    config = json.loads((pathlib.Path(model) / "config.json").read_text())
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = max(1, config["num_key_value_heads"] // tp)
    layers = -(-config["num_hidden_layers"] // pp)
    per_token = 2 * layers * kv_heads * head * 4  # float32 keys and values
    return NUM_KV_BLOCKS * BLOCK_SIZE * per_token


def _engine(model: str, tp: int, pp: int = 1) -> LLM:
    return LLM(
        model,
        device="cpu",
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        max_model_len=128,
        max_num_batched_tokens=40,  # prompts of 50+ tokens are computed in chunks
        max_num_seqs=6,
        kv_cache_memory_bytes=_kv_bytes(model, tp, pp),
        async_scheduling=pp == 1,  # the first pipeline stage needs each step's tokens on the host
    )


def _run(llm: LLM) -> list[list[list[int]]]:
    prefix = [(5 * i + 3) % 300 + 10 for i in range(40)]  # shared by every prompt: later ones hit the cache
    prompts = [prefix + [(7 * i + j) % 300 + 10 for j in range(10 + i)] for i in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    params = [greedy] * 5 + [SamplingParams(n=2, temperature=0.9, seed=11, max_tokens=24, ignore_eos=True)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [[c.token_ids for c in out.outputs] for out in outputs]


@pytest.mark.parametrize(("arch", "kv_heads", "tp", "pp"), LAYOUTS)
def test_parallel_matches_one_rank(tmp_path, caplog, arch, kv_heads, tp, pp):
    model = str(make_tiny_model(tmp_path / arch, arch, num_kv_heads=kv_heads))
    one_rank = _engine(model, 1)
    expected = _run(one_rank)
    with caplog.at_level(logging.INFO, logger="brisk.engine.engine"):
        llm = _engine(model, tp, pp)
    try:
        # the start-up arithmetic: each rank holds about half the weights (or less) and plans its own KV cache
        assert f"= {NUM_KV_BLOCKS * BLOCK_SIZE} tokens" in caplog.text and f"({tp * pp} ranks)" in caplog.text
        assert llm.engine.model_runner.weight_bytes() < 0.6 * one_rank.engine.model_runner.weight_bytes()
        in_flight = []  # batches already in flight each time one is launched
        launch = llm.engine._launch
        llm.engine._launch = lambda: in_flight.append(len(llm.engine._pipeline)) or launch()
        assert _run(llm) == expected
        assert max(in_flight) == pp - 1  # with pipeline stages, one batch per stage in flight
        stats = llm.engine.get_stats()
        assert llm.engine.scheduler.num_preemptions > 0
        assert stats.prefix_cache_hits > 0
    finally:
        llm.engine.model_runner.shutdown()


def test_structured_outputs_on_two_ranks(tiny_llama):
    """The grammar's matcher stays on the driver; each step's message carries the sampling rank the bitmask of
    every row under a grammar. Sampled at temperature 1 with seeds, two ranks give one rank's tokens, and every
    text follows its grammar."""
    from tests.engine.test_structured_outputs import SCHEMAS

    constraints = [
        {"json": SCHEMAS[0], "disable_any_whitespace": True},
        {"regex": r"[0-9]{3}-[a-z]{2}"},
        {"choice": ["yes", "no way"]},
    ]
    params = [
        SamplingParams(n=2, temperature=1.0, seed=7 + i, max_tokens=120, structured_outputs=so)
        for i, so in enumerate(constraints)
    ]
    runs = []
    for tp in (2, 1):
        llm = LLM(tiny_llama, device="cpu", tensor_parallel_size=tp, max_model_len=256)
        try:
            runs.append(llm.generate(["Data:", "Code:", "Answer:"], params, use_tqdm=False))
        finally:
            if tp > 1:
                llm.engine.model_runner.shutdown()
    assert [[c.token_ids for c in out.outputs] for out in runs[0]] == [
        [c.token_ids for c in out.outputs] for out in runs[1]
    ]
    texts = [[c.text for c in out.outputs] for out in runs[0]]
    for text in texts[0]:
        jsonschema.validate(json.loads(text, strict=False), SCHEMAS[0])
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2}", text) for text in texts[1])
    assert all(text in ("yes", "no way") for text in texts[2])
