"""Executors run the model runner for the engine: in the engine's own process (one rank, no overhead: the
``ModelRunner`` itself) or as one worker process per rank (``MultiprocExecutor``), possibly across machines
(``nodes.py``). Both have the model runner's interface, which is all the engine sees."""

from __future__ import annotations

import torch

from brisk.config import EngineArgs, ModelConfig, usable_cores
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
        block_size=args.block_size,
        attention_backend=attention_backend,
        load_format=args.load_format,
        seed=args.seed,
        cpu_threads=rank_cpu_threads(args),
    )


def rank_cpu_threads(args: EngineArgs) -> int | None:
    """torch threads of each CPU rank: the engine's ``cpu_threads`` (else one a core) shared by this machine's ranks,
    so that ranks never oversubscribe the cores (threads waiting on each other collapse: docs/benchmarks.md).
    None for a lone rank left at the default: torch's own count."""
    ranks_here = args.world_size // args.nnodes
    if args.cpu_threads is None and ranks_here == 1:
        return None
    return max(1, (args.cpu_threads or usable_cores()) // ranks_here)


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
