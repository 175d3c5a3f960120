"""``cpu_threads``: the engine's torch threads on the CPU, shared by its ranks."""

from __future__ import annotations

import pytest
import torch

from brisk import LLM, SamplingParams
from brisk.config import EngineArgs, usable_cores
from brisk.executor import rank_cpu_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_an_engine_runs_on_its_threads(tiny_llama, restore_threads):
    torch.set_num_threads(2)
    llm = LLM(tiny_llama, device="cpu", cpu_threads=1, kv_cache_memory_bytes=1 << 22)
    assert torch.get_num_threads() == 1
    assert llm.generate(["Hi"], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids


def test_ranks_share_the_threads():
    def split(**kwargs) -> int | None:
        return rank_cpu_threads(EngineArgs(model="m", **kwargs))

    assert split() is None  # one rank, nothing asked: torch's own default
    assert split(cpu_threads=3) == 3
    assert split(cpu_threads=5, tensor_parallel_size=2) == 2
    assert split(cpu_threads=1, tensor_parallel_size=2, pipeline_parallel_size=2) == 1  # never 0
    assert split(tensor_parallel_size=2) == max(1, usable_cores() // 2)
    assert split(cpu_threads=8, tensor_parallel_size=4, nnodes=2) == 4  # two ranks on each machine


def test_bad_thread_counts_are_errors():
    for value in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="cpu_threads"):
            EngineArgs(model="m", cpu_threads=value).validate()
