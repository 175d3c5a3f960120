"""``distributed_executor_backend="ray"`` on a two-node Ray cluster on loopback: two ``ray start`` processes with
one CPU each, so the two tensor-parallel ranks land on different nodes. One request end to end, equal to the
tokens of one rank."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brisk import LLM, SamplingParams
from tests.server.conftest import REPO_ROOT, free_port

RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture
def ray_cluster(tmp_path, monkeypatch):
    """Two Ray nodes on this machine (``ray start --block``: stopping the command stops its node)."""
    import ray

    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    common = ["--num-cpus", "1", "--num-gpus", "0", "--block", "--disable-usage-stats"]
    head = [RAY, "start", "--head", "--port", str(port), "--include-dashboard", "false", *common]
    nodes = [subprocess.Popen(head, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        address = f"127.0.0.1:{port}"
        worker = [RAY, "start", "--address", address, *common]
        nodes.append(subprocess.Popen(worker, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ray.init(address=address, log_to_driver=False)
        deadline = time.monotonic() + 120
        while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield address
    finally:
        ray.shutdown()
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait(60)


def test_tp2_across_two_ray_nodes(tiny_llama, ray_cluster):
    import ray

    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = LLM(tiny_llama, device="cpu", max_model_len=128).generate([[5, 6, 7, 8]], params, use_tqdm=False)
    llm = LLM(
        tiny_llama,
        device="cpu",
        max_model_len=128,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        kv_cache_memory_bytes=1 << 20,
    )
    try:
        executor = llm.engine.model_runner
        placed = ray.util.placement_group_table(executor._ray_ranks.placement_group)["bundles_to_node_id"]
        assert len(set(placed.values())) == 2  # one rank on each node
        got = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
        assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    finally:
        executor.shutdown()
