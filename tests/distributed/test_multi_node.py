"""torchrun-style launches (``--nnodes/--node-rank/--master-addr/--master-port``) with both "nodes" on this
machine: node 1 is ``brisk serve --node-rank 1`` in its own process, node 0 the engine in this one; TP=2 puts one
rank on each. A node that does not arrive is a timeout error naming the missing ranks, on either side."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from brisk import LLM, SamplingParams
from brisk.executor.multiproc import WorkerFailedError
from tests.server.conftest import REPO_ROOT, free_port

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9], [20, 21, 22]]


def _node(model: str, node_rank: int, port: int, timeout_s: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "BRISK_WORKER_TIMEOUT_S": str(timeout_s)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    argv = ["serve", model, "--device", "cpu", "-tp", "2", "--nnodes", "2", "--node-rank", str(node_rank)]
    argv += ["--master-addr", "127.0.0.1", "--master-port", str(port), "--max-model-len", "128"]
    command = [sys.executable, "-m", "brisk.entrypoints.cli.main", *argv]
    output = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.Popen(command, env=env, cwd=REPO_ROOT, **output)


def _tokens(llm: LLM) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_two_nodes_tp2(tiny_llama):
    expected = _tokens(LLM(tiny_llama, device="cpu", max_model_len=128))
    port = free_port()
    node1 = _node(tiny_llama, 1, port, timeout_s=120)
    try:
        llm = LLM(
            tiny_llama,
            device="cpu",
            max_model_len=128,
            tensor_parallel_size=2,
            nnodes=2,
            node_rank=0,
            master_port=port,
            kv_cache_memory_bytes=1 << 20,
        )
        assert _tokens(llm) == expected
        llm.engine.model_runner.shutdown()
        output, _ = node1.communicate(timeout=60)
        assert node1.returncode == 0, output  # node 1's rank ends when the engine stops
    finally:
        node1.kill()


def test_missing_node_times_out(tiny_llama, monkeypatch):
    monkeypatch.setenv("BRISK_WORKER_TIMEOUT_S", "3")
    with pytest.raises(WorkerFailedError, match=r"worker ranks 1 did not connect to 127\.0\.0\.1:\d+ within 3 s"):
        LLM(tiny_llama, device="cpu", tensor_parallel_size=2, nnodes=2, master_port=free_port())


def test_node_without_engine_times_out(tiny_llama):
    node1 = _node(tiny_llama, 1, free_port(), timeout_s=3)
    output, _ = node1.communicate(timeout=120)
    assert node1.returncode != 0
    assert "node 0 at 127.0.0.1" in output and "did not answer within 3 s" in output
