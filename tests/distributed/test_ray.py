"""``distributed_executor_backend="ray"`` on a two-node Ray cluster on loopback: two ``ray start`` processes with
one CPU each, so the two tensor-parallel ranks land on different nodes. One request end to end, equal to the
tokens of one rank, for a plain folder and for one whose config class is its own Python (``trust_remote_code``);
a rank that fails to start fails the engine's start at once, not at the worker timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brisk import LLM, SamplingParams
from brisk.executor import ray_ranks
from brisk.executor.multiproc import WorkerFailedError
from tests.server.conftest import REPO_ROOT, free_port
from tests.tiny_models import make_remote_code_copy

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


@pytest.mark.parametrize("remote_code", [False, True])
def test_tp2_across_two_ray_nodes(tiny_llama, ray_cluster, tmp_path, remote_code):
    """With ``trust_remote_code`` the ranks get the folder's config class by value: their processes cannot import
    transformers' ``transformers_modules`` cache of the driver's machine."""
    import ray

    model = str(make_remote_code_copy(tiny_llama, tmp_path / "shortllama")) if remote_code else tiny_llama
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = LLM(tiny_llama, device="cpu", max_model_len=128).generate([[5, 6, 7, 8]], params, use_tqdm=False)
    llm = LLM(
        model,
        device="cpu",
        max_model_len=128,
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        kv_cache_memory_bytes=1 << 20,
        trust_remote_code=remote_code,
    )
    try:
        executor = llm.engine.model_runner
        placed = ray.util.placement_group_table(executor._ray_ranks.placement_group)["bundles_to_node_id"]
        assert len(set(placed.values())) == 2  # one rank on each node
        got = llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
        assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    finally:
        executor.shutdown()


def test_a_rank_that_fails_to_start_fails_the_engine_at_once(tiny_llama, ray_cluster, tmp_path, monkeypatch):
    """The remote-code config sent by reference, as before the fix: the ranks cannot unpickle it, and the engine
    says so within seconds, naming the error, instead of waiting for connections until the worker timeout."""
    monkeypatch.setattr(ray_ranks, "_pickle_remote_code_by_value", lambda: None)
    monkeypatch.setenv("BRISK_WORKER_TIMEOUT_S", "600")
    # A module of its own: the other test's was registered for pickling by value, for the whole process.
    model = str(make_remote_code_copy(tiny_llama, tmp_path / "shortllama", comment="sent by reference"))
    started = time.monotonic()
    with pytest.raises(WorkerFailedError, match="Ray rank [01] failed to start: .*transformers_modules"):
        LLM(model, device="cpu", max_model_len=128, tensor_parallel_size=2, distributed_executor_backend="ray",
            kv_cache_memory_bytes=1 << 20, trust_remote_code=True)  # fmt: skip
    assert time.monotonic() - started < 120
