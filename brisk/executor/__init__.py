"""Executors run the model runner for the engine: in the engine's own process (one rank, no overhead: the
``ModelRunner`` itself) or as one worker process per rank (``MultiprocExecutor``), possibly across machines
(``nodes.py``). Both have the model runner's interface, which is all the engine sees."""

from __future__ import annotations

import torch

from brisk.config import EngineArgs, ModelConfig
from brisk.distributed.parallel_config import check_device_count, check_parallel_shapes
from brisk.worker.model_runner import ModelRunner


def check_parallel_layout(args: EngineArgs, model_config: ModelConfig, device: torch.device) -> None:
    """The model splits over the requested ranks, and this machine has a device for each of its ranks."""
    check_parallel_shapes(model_config.hf_config, args.tensor_parallel_size, args.pipeline_parallel_size)
    device_count = torch.cuda.device_count() if device.type == "cuda" else 0
    check_device_count(args.world_size // args.nnodes, device.type, device_count)


def runner_args(args: EngineArgs, attention_backend: str) -> dict:
    """``ModelRunner``'s arguments besides the model config and the device."""
    return dict(
        block_size=args.block_size, attention_backend=attention_backend, load_format=args.load_format, seed=args.seed
    )


def create_executor(args: EngineArgs, model_config: ModelConfig, device: torch.device, attention_backend: str):
    """Check that the model splits over the requested ranks and devices, then start the ranks."""
    if args.node_rank > 0:
        raise ValueError(
            f"node_rank={args.node_rank} runs only that node's ranks, not an engine: start it with `brisk serve` "
            "(or `brisk generate`) and --node-rank, and build the engine on node 0."
        )
    check_parallel_layout(args, model_config, device)
    backend = args.distributed_executor_backend or ("uni" if args.world_size == 1 else "mp")
    if backend == "uni":
        return ModelRunner(model_config, device, **runner_args(args, attention_backend))
    from brisk.executor.multiproc import MultiprocExecutor

    return MultiprocExecutor(
        model_config,
        device,
        args.tensor_parallel_size,
        args.pipeline_parallel_size,
        runner_args(args, attention_backend),
        nnodes=args.nnodes,
        master_addr=args.master_addr,
        master_port=args.master_port,
        use_ray=backend == "ray",
    )
