"""Parallel sizes that cannot work fail with a message naming the numbers, before any worker process starts."""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

import pytest

from brisk import LLM
from brisk.distributed.parallel_config import check_device_count, check_parallel_shapes
from brisk.entrypoints.cli.main import main


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tensor_parallel_size": 3}, "num_attention_heads=4 is not divisible by tensor_parallel_size=3"),
        ({"pipeline_parallel_size": 3}, "pipeline_parallel_size=3 is larger than the model's 2 layers"),
        ({"pipeline_parallel_size": 2, "async_scheduling": True}, "async_scheduling needs each step's sampled"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size must be >= 1"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be an integer"),
        ({"tensor_parallel_size": 2, "distributed_executor_backend": "uni"}, "need 'mp'"),
        ({"distributed_executor_backend": "slurm"}, "distributed_executor_backend must be one of"),
        ({"distributed_executor_backend": "ray", "nnodes": 2, "tensor_parallel_size": 2}, "leave nnodes"),
        ({"tensor_parallel_size": 2, "nnodes": 2, "node_rank": 2}, r"node_rank must be in \[0, nnodes=2\)"),
        ({"tensor_parallel_size": 3, "nnodes": 2}, "3 ranks do not split evenly over nnodes=2"),
        ({"tensor_parallel_size": 2, "nnodes": 2, "node_rank": 1}, "runs only that node's ranks"),
        # features not split over ranks yet: refused rather than wrong
        (
            {
                "tensor_parallel_size": 2,
                "speculative_config": {"method": "draft_model", "model": "x", "num_speculative_tokens": 2},
            },
            "speculative_config method 'draft_model' is not supported with worker processes",
        ),
        (
            {
                "distributed_executor_backend": "mp",
                "speculative_config": {"method": "draft_model", "model": "x", "num_speculative_tokens": 2},
            },
            "speculative_config method 'draft_model' is not supported with worker processes",
        ),
    ],
)
def test_bad_parallel_sizes(tiny_llama, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny_llama, device="cpu", **kwargs)
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize(
    ("heads", "kv_heads", "intermediate", "tp", "match"),
    [
        (12, 4, 96, 3, "num_key_value_heads=4 and tensor_parallel_size=3: one must divide the other"),
        (10, 2, 96, 4, "num_attention_heads=10 is not divisible"),
        (8, 2, 100, 8, "intermediate_size=100 is not divisible by tensor_parallel_size=8"),
    ],
)
def test_shapes_that_do_not_split(heads, kv_heads, intermediate, tp, match):
    config = SimpleNamespace(
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=intermediate, num_hidden_layers=2
    )
    with pytest.raises(ValueError, match=match):
        check_parallel_shapes(config, tp, 1)
    check_parallel_shapes(config, 1, 1)
    check_parallel_shapes(SimpleNamespace(**{**vars(config), "num_key_value_heads": 2}), 2, 1)  # 2 KV heads, TP=2


def test_more_ranks_than_gpus():
    with pytest.raises(ValueError, match="2 ranks need 2 GPUs, but 1 is visible"):
        check_device_count(2, "cuda", 1)
    check_device_count(4, "cpu", 0)  # CPU ranks are processes


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench"])
def test_cli_flags(command):
    """``-tp``/``-pp`` (vLLM's short names) and the executor backend reach every command's engine arguments."""
    from brisk.entrypoints.cli import common
    from brisk.entrypoints.cli.engine_args import engine_kwargs
    from brisk.entrypoints.cli.main import build_parser

    argv = [command, *(["throughput"] if command == "bench" else []), "--model", "m", "-tp", "2", "-pp", "1"]
    args = build_parser().parse_args([*argv, "--distributed-executor-backend", "mp"])
    expected = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "distributed_executor_backend": "mp"}
    if command in ("generate", "chat"):
        engine_args = common.engine_args_from_args(args)
        assert {name: getattr(engine_args, name) for name in expected} == expected
    else:
        assert expected.items() <= engine_kwargs(args).items()


def test_cli_bad_tp_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "hi", "-tp", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--tensor-parallel-size" in err and "0" in err
